"""Keep a GGUF file's 4-bit linear weights quantized: Q4_0 / Q4_1 / Q4_K -> our int4, group 32.

Our int4 form is w = (q - 8) * scale + zero, codes q in 0..15, one (scale, zero)
per 32 weights along the input dimension (minillm.quant.int4). llama.cpp's
4-bit types land on it with the codes copied, never re-rounded:

    Q4_0:  blocks of 32, fp16 d:             w = (q - 8) * d     -> scale = d, zero = 0
    Q4_1:  blocks of 32, fp16 d, m:          w = q * d + m       -> scale = d, zero = m + 8 d
    Q4_K:  super-blocks of 256 = 8 sub-blocks of 32, fp16 d and dmin, 6-bit sc[j], m[j]:
                                             w = d sc_j q - dmin m_j
                                                                 -> scale = d sc_j, zero = 8 d sc_j - dmin m_j

Q4_K byte layout per super-block (144 bytes; gguf-py quants.Q4_K, llama.cpp
block_q4_K): d (fp16), dmin (fp16), 12 bytes of scales, 128 bytes of codes.
The 12 bytes hold sc[0..3], m[0..3] in the low 6 bits of bytes 0..3 / 4..7, and
sc[4..7], m[4..7] as the low / high nibble of bytes 8..11 plus the top 2 bits of
bytes 0..3 / 4..7. The codes come in 4 chunks of 32 bytes, each 64 weights:
the low nibbles are sub-block 2c (weights 64c..64c+31), the high nibbles
sub-block 2c+1 -- not the even/odd interleave of our packed form.

Exactness, portable ("plain") layout, scales float32:
- Q4_0 reproduces gguf's dequantize bit for bit; Q4_1 up to one float32
  rounding (zero = m + 8d is formed once).
- Q4_K: d*sc_j (<= 17 significant bits) and (q - 8)*d*sc_j are exact in
  float32, so our w is gguf's d*sc*q - dmin*m rounded once -- bit for bit --
  whenever zero = 8 d sc_j - dmin m_j is itself exact in float32, which holds
  when dmin's binary exponent is within [-4, +10] of d's. Every super-block of
  Qwen2.5-Coder-0.5B Q4_K_M has a gap in [-1, 4]; outside it zero takes one
  float32 rounding (<= 2^-24 |zero|).
torch's CPU int4 kernel (the "cpu" layout) takes bf16 scales and zeros (8
significant bits): each of scale and zero is off by <= 2^-8 of itself, so a
weight by <= 2^-8 (|q - 8| |scale| + |zero|) <= 2^-8 (16 |scale| + dmin m_j),
about 1/240 of the group's range 15*scale when the min term is small.
Activations are also cast to bf16 and the output comes back as bf16 (see
tests/test_quant_gguf_kquant.py for the measured matmul error).

What maps: Q4_0, Q4_1, Q4_K (K divisible by 256) linear weights. A fused layer
(qkv_proj, gate_up_proj) maps only if all its parts do (mixing these three is
fine: all are group 32). What stays dequantized float, as before: Q5_0, Q5_1,
Q5_K, Q6_K (5/6-bit codes: int4 cannot hold them, re-rounding to int4 would be a
lossy choice this module does not make), Q8_0 (groups of 32 do not fit torch's
per-channel int8 kernel), F16/F32 and anything else; the embedding and LM head
are never touched. In Qwen2.5-Coder's Q4_K_M files that means: 0.5B -- only
the 12 Q4_K ffn_down of 24 (K=896 is not a multiple of 256, so its other
matrices are Q5_0/Q8_0); 1.5B -- every o_proj and gate_up_proj, the 14 of 28
qkv_proj whose attn_v is Q4_K, the 14 Q4_K ffn_down.

Measured, packed "gguf" vs the same file dequantized to float32 (AMD EPYC, 2
cores shared with other jobs, AVX-512 + avx512_bf16 + avx512_vnni, no AMX;
ppl and top-1 on pydoc_data.topics eval windows of 256 tokens; greedy: 4 code
prompts, positions whose token equals the float model's; tok/s: `minillm bench
quant`, batch-1 decode, median of 3 alternated repeats, load average ~1-2):

    Q4_K_M  packed  greedy match        top-1 (windows)  ppl float -> gguf       W MB/tok     tok/s float -> gguf
    0.5B    12/96   512/512 (128 x 4)   0.9971 (8)       12.641 -> 12.644 +0.02%  1976 -> 1800  7.4 -> 9.5
    1.5B    84/112  128/128 (32 x 4)    0.9961 (2)        7.087 ->  7.088 +0.01%  6175 -> 2552  2.8 -> 6.7
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType

from minillm.cpu.kernels.gguf_cpu import q4k_scale_min
from minillm.models.llama import LlamaForCausalLM
from minillm.quant.int4 import Int4Weight, pack_int4
from minillm.quant.linear import QuantLinear

GROUP = 32
QK_K = 256  # weights per K-quant super-block
_BLOCK = {  # type -> (weights per block, bytes per block)
    GGMLQuantizationType.Q4_0: (32, 18),
    GGMLQuantizationType.Q4_1: (32, 20),
    GGMLQuantizationType.Q4_K: (QK_K, 144),
}
MAPPED_TYPES = tuple(t.name for t in _BLOCK)


def _fp16(raw: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 -> [...] float32 (little-endian fp16, as GGUF stores it)."""
    return raw.contiguous().view(torch.float16).float().squeeze(-1)


def _q4_01(raw: torch.Tensor, qtype: GGMLQuantizationType) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, nb, 18|20] -> codes [N, nb, 32], scale and zero [N, nb]."""
    d = _fp16(raw[..., 0:2])
    if qtype == GGMLQuantizationType.Q4_1:
        qs, zero = raw[..., 4:], _fp16(raw[..., 2:4]) + 8.0 * d
    else:
        qs, zero = raw[..., 2:], torch.zeros_like(d)
    # a block's 16 bytes hold elements 0..15 in the low nibbles, 16..31 in the high ones
    return torch.cat((qs & 0xF, qs >> 4), dim=-1), d, zero


def _q4_k(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, nsb, 144] -> codes [N, nsb*8, 32], scale and zero [N, nsb*8] (one per sub-block of 32)."""
    n, nsb, _ = raw.shape
    d, dmin = _fp16(raw[..., 0:2]), _fp16(raw[..., 2:4])  # [N, nsb]
    sc, mn = q4k_scale_min(raw[..., 4:16])  # [N, nsb, 8]
    qs = raw[..., 16:].reshape(n, nsb, 4, 1, 32)
    # chunk c of 32 bytes: low nibbles = sub-block 2c, high nibbles = sub-block 2c + 1
    codes = torch.cat((qs & 0xF, qs >> 4), dim=3).reshape(n, nsb * 8, 32)
    scale = d[..., None] * sc.float()  # exact: 11 x 6 significant bits
    zero = 8.0 * scale - dmin[..., None] * mn.float()  # one float32 rounding at most (see the docstring)
    return codes, scale.reshape(n, -1), zero.reshape(n, -1)


def gguf_block_int4(data: np.ndarray, qtype: GGMLQuantizationType, in_features: int) -> Int4Weight:
    """Raw Q4_0/Q4_1/Q4_K rows (uint8 [N, blocks * bytes]) -> Int4Weight with group 32, codes copied."""
    if qtype not in _BLOCK:
        raise ValueError(f"only {MAPPED_TYPES} map onto int4 groups, got {qtype.name}")
    per_block, nbytes = _BLOCK[qtype]
    if in_features % per_block:
        raise ValueError(f"{qtype.name} rows need in_features divisible by {per_block}, got {in_features}")
    nb = in_features // per_block
    # np.array: a writable copy of the (read-only) mmap rows
    raw = torch.from_numpy(np.array(data)).reshape(data.shape[0], nb, nbytes)
    codes, scale, zero = _q4_k(raw) if qtype == GGMLQuantizationType.Q4_K else _q4_01(raw, qtype)
    sz = torch.stack((scale.t(), zero.t()), dim=-1).contiguous()  # [K/32, N, 2]
    return Int4Weight(pack_int4(codes.reshape(raw.shape[0], in_features)), sz, GROUP, in_features)


def _rows(w: Int4Weight, perm_heads: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpacked codes [N, K] and per-row scale_zeros [N, G, 2], RoPE rows un-permuted if asked."""
    from minillm.loader.gguf import unpermute_rope_rows
    from minillm.quant.int4 import unpack_int4

    codes, sz = unpack_int4(w.qweight, w.in_features), w.scale_zeros.transpose(0, 1)
    if perm_heads is not None:
        codes, sz = unpermute_rope_rows(codes, perm_heads), unpermute_rope_rows(sz, perm_heads)
    return codes, sz


def _concat(parts: list[tuple[torch.Tensor, torch.Tensor]], in_features: int) -> Int4Weight:
    codes = torch.cat([c for c, _ in parts])
    sz = torch.cat([s for _, s in parts]).transpose(0, 1).contiguous()
    return Int4Weight(pack_int4(codes), sz, GROUP, in_features)


def _maps(t, in_features: int) -> bool:
    return t is not None and t.tensor_type in _BLOCK and in_features % _BLOCK[t.tensor_type][0] == 0


@torch.no_grad()
def keep_gguf_quantized(model: LlamaForCausalLM, path: str | Path, use_cpu_kernels: bool = True) -> dict[str, str]:
    """Swap every decoder linear whose GGUF tensors are all Q4_0/Q4_1/Q4_K for a QuantLinear with the file's codes.

    The model was loaded from the same file (dequantized); its float weights of
    the swapped layers are dropped. Returns {layer: what happened} for the report.
    """
    from minillm.loader.gguf import FastGGUFReader
    from minillm.quant.gguf_linear import LAYER_PLAN, rope_heads

    reader = FastGGUFReader(Path(path))
    tensors = {t.name: t for t in reader.tensors}
    cfg = model.config
    heads = rope_heads(cfg)  # the same fused-layer plan as the blocks path, with RoPE-permuted row counts
    plan = {target: [(p, heads.get(h)) for p, h in parts] for target, parts in LAYER_PLAN.items()}
    report: dict[str, str] = {}
    for i, layer in enumerate(model.layers):
        for target, parts in plan.items():
            name = f"layers.{i}.{target}"
            ts = [tensors.get(f"blk.{i}.{p}.weight") for p, _ in parts]
            kinds = sorted({t.tensor_type.name for t in ts if t is not None})
            lin = layer.get_submodule(target)
            k = lin.in_features
            if not all(_maps(t, k) for t in ts):
                report[name] = "dequantized (" + ",".join(kinds) + ")"
                continue
            rows = [_rows(gguf_block_int4(t.data, t.tensor_type, k), perm_heads)
                    for t, (_, perm_heads) in zip(ts, parts)]
            q = QuantLinear.from_quantized(_concat(rows, k), bias=lin.bias.detach() if lin.bias is not None else None)
            q = q.to(lin.weight.device)
            if use_cpu_kernels and lin.weight.device.type == "cpu":
                q.use_cpu_kernels()
            parent, _, attr = target.rpartition(".")
            setattr(layer.get_submodule(parent), attr, q)
            report[name] = "+".join(kinds) + f" -> int4 g{GROUP}"
    return report
