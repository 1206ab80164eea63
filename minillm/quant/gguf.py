"""Keep a GGUF file's 4-bit linear weights quantized: Q4_0 / Q4_1 -> our int4, group 32.

llama.cpp's blocks are 32 weights along the input dimension, one fp16 scale d
(and for Q4_1 one fp16 min m) per block, codes q in 0..15:

    Q4_0:  w = (q - 8) * d            -> scale = d, zero = 0
    Q4_1:  w = q * d + m              -> scale = d, zero = m + 8 * d

which is exactly our int4 form w = (q - 8) * scale + zero with group size 32,
so the codes are copied, not re-rounded. In the portable ("plain") layout the
scales stay float32: Q4_0 reproduces gguf's dequantize bit for bit, Q4_1 up to
one float32 rounding (zero = m + 8d is formed once). torch's CPU int4 kernel
takes bf16 scales and zeros, so on that path d and m lose 3 of fp16's 10
mantissa bits (relative error <= 2^-9 per scale): close, not exact.

What maps: Q4_0, Q4_1 linear weights (the default file's every decoder
linear). What is dequantized as before: Q8_0 (the default file's embedding,
tied to the LM head -- kept float like every other method here; Q8_0's
groups-of-32 scales do not fit torch's per-channel int8 kernel), F16/F32,
and any other type.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType

from minillm.models.llama import LlamaForCausalLM
from minillm.quant.int4 import Int4Weight, pack_int4
from minillm.quant.linear import QuantLinear

GROUP = 32
_BLOCK_BYTES = {GGMLQuantizationType.Q4_0: 18, GGMLQuantizationType.Q4_1: 20}
MAPPED_TYPES = tuple(t.name for t in _BLOCK_BYTES)


def gguf_block_int4(data: np.ndarray, qtype: GGMLQuantizationType, in_features: int) -> Int4Weight:
    """Raw Q4_0/Q4_1 rows (uint8 [N, blocks * bytes]) -> Int4Weight with group 32, codes copied."""
    if qtype not in _BLOCK_BYTES:
        raise ValueError(f"only {MAPPED_TYPES} map onto int4 groups, got {qtype.name}")
    if in_features % GROUP:
        raise ValueError(f"{qtype.name} rows need in_features divisible by {GROUP}, got {in_features}")
    nb = in_features // GROUP
    # np.array: a writable copy of the (read-only) mmap rows
    raw = torch.from_numpy(np.array(data)).reshape(data.shape[0], nb, _BLOCK_BYTES[qtype])
    n = raw.shape[0]
    d = raw[..., 0:2].contiguous().view(torch.float16).float().squeeze(-1)  # [N, nb]
    if qtype == GGMLQuantizationType.Q4_1:
        m = raw[..., 2:4].contiguous().view(torch.float16).float().squeeze(-1)
        qs = raw[..., 4:]
        zero = m + 8.0 * d
    else:
        qs = raw[..., 2:]
        zero = torch.zeros_like(d)
    # a block's 16 bytes hold elements 0..15 in the low nibbles, 16..31 in the high ones
    codes = torch.cat((qs & 0xF, qs >> 4), dim=-1).reshape(n, in_features)
    sz = torch.stack((d.t(), zero.t()), dim=-1).contiguous()  # [nb, N, 2]
    return Int4Weight(pack_int4(codes), sz, GROUP, in_features)


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


@torch.no_grad()
def keep_gguf_quantized(model: LlamaForCausalLM, path: str | Path, use_cpu_kernels: bool = True) -> dict[str, str]:
    """Swap every decoder linear whose GGUF tensors are Q4_0/Q4_1 for a QuantLinear with the file's codes.

    The model was loaded from the same file (dequantized); its float weights of
    the swapped layers are dropped. Returns {layer: what happened} for the report.
    """
    from minillm.loader.gguf import _Reader

    reader = _Reader(Path(path))
    tensors = {t.name: t for t in reader.tensors}
    cfg = model.config
    permuted = cfg.model_type == "llama"
    plan = {  # our fused layer -> the GGUF tensors stacked along rows, with RoPE-permuted row counts
        "self_attn.qkv_proj": [("attn_q", cfg.num_attention_heads), ("attn_k", cfg.num_key_value_heads), ("attn_v", None)],
        "self_attn.o_proj": [("attn_output", None)],
        "mlp.gate_up_proj": [("ffn_gate", None), ("ffn_up", None)],
        "mlp.down_proj": [("ffn_down", None)],
    }
    report: dict[str, str] = {}
    for i, layer in enumerate(model.layers):
        for target, parts in plan.items():
            name = f"layers.{i}.{target}"
            ts = [tensors.get(f"blk.{i}.{p}.weight") for p, _ in parts]
            kinds = {t.tensor_type for t in ts if t is not None}
            lin = layer.get_submodule(target)
            if None in ts or not kinds <= set(_BLOCK_BYTES):
                report[name] = "dequantized (" + ",".join(sorted(k.name for k in kinds)) + ")"
                continue
            k = lin.in_features
            rows = [_rows(gguf_block_int4(t.data, t.tensor_type, k), heads if permuted else None)
                    for t, (_, heads) in zip(ts, parts)]
            q = QuantLinear.from_quantized(_concat(rows, k), bias=lin.bias.detach() if lin.bias is not None else None)
            q = q.to(lin.weight.device)
            if use_cpu_kernels and lin.weight.device.type == "cpu":
                q.use_cpu_kernels()
            parent, _, attr = target.rpartition(".")
            setattr(layer.get_submodule(parent), attr, q)
            report[name] = "+".join(sorted(k.name for k in kinds)) + f" -> int4 g{GROUP}"
    return report
