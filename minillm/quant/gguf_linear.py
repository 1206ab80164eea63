"""GGUFLinear: a linear layer computed on a GGUF file's own blocks (no dequantized copy).

The weight stays as the file stores it -- Q4_0, Q4_1, Q5_0, Q8_0, Q4_K or Q6_K
blocks, one byte string per output row -- and the C++ kernels of
minillm/cpu/kernels/gguf_cpu.py multiply it by the activation quantized to int8 blocks, as
llama.cpp does. A fused layer (qkv_proj, gate_up_proj) may mix types (Qwen2.5's
Q4_K_M files store some attn_v and ffn_down as Q6_K): it holds one part per
GGUF tensor, and each part writes its own columns of the output.

Error budget: the weights are exact (the file's codes and scales, read as the
file means them; tests/test_gguf_cpu_kernels.py checks the dequantized rows
against gguf-py's bit for bit); the activation is rounded to 8 bits per block of
32 or 256 values, so a row's output is off by about 0.5-0.7% of the output's
norm for Gaussian inputs (measured on every type, same test).

CPU only: on other devices minillm.quant.gguf maps the 4-bit types onto int4 instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from minillm.cpu.kernels import gguf_cpu


@dataclass(frozen=True)
class GGUFPart:
    """One GGUF tensor inside a (possibly fused) layer: its type and how many output rows it holds."""

    type_name: str
    rows: int

    @property
    def type_id(self) -> int:
        return gguf_cpu.TYPE_IDS[self.type_name]


class GGUFLinear(nn.Module):
    """y = x @ W.T + b with W kept as GGUF blocks (parts stacked along the output rows)."""

    def __init__(self, in_features: int, parts: list[tuple[str, torch.Tensor]], bias: torch.Tensor | None = None) -> None:
        super().__init__()
        simd = gguf_cpu.load().isa() != "portable"  # GGUFKernelUnavailable when this machine cannot build them
        self.in_features = in_features
        self.parts: list[GGUFPart] = []
        self.type_ids: list[int] = []  # what the kernel is told: a file type, or one of our 8-row layouts
        for i, (type_name, raw) in enumerate(parts):
            if type_name not in gguf_cpu.TYPE_IDS:
                raise ValueError(f"GGUFLinear: {type_name} blocks have no kernel (supported: {sorted(gguf_cpu.TYPE_IDS)})")
            per_row = gguf_cpu.row_bytes(gguf_cpu.TYPE_IDS[type_name], in_features)
            if in_features % gguf_cpu.activation_block(gguf_cpu.TYPE_IDS[type_name]) or raw.numel() % per_row:
                raise ValueError(f"GGUFLinear: {raw.numel()} bytes of {type_name} are not whole rows of {in_features}")
            part = GGUFPart(type_name, raw.numel() // per_row)
            self.parts.append(part)
            blocks, type_id = raw.reshape(part.rows, per_row).to(torch.uint8), part.type_id
            # 8 rows interleaved (Q4_K, Q4_1/Q4_0, Q8_0): the kernel takes 8 rows' products in one register's
            # lanes and applies their scales with one vector op each (Q4_K: 1.6x the single-thread speed of
            # the row-by-row kernel, measured; the default model's Q4_1 decode 0.57x -> 0.95x llama.cpp)
            packed = gguf_cpu.interleave(type_name, blocks) if simd else None
            if packed is not None:
                blocks, type_id = packed
            self.register_buffer(f"blocks{i}", blocks.reshape(-1).contiguous())
            self.type_ids.append(type_id)
        self.out_features = sum(p.rows for p in self.parts)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one op for the whole layer: activation quantized once per block size, every part's rows, the bias
        y = torch.ops.minillm_gguf.linear(x.reshape(-1, self.in_features), self.blocks(), self.type_ids, self.bias)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def blocks(self) -> list[torch.Tensor]:
        return [getattr(self, f"blocks{i}") for i in range(len(self.parts))]

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 [out, in] weight the blocks stand for (tests, and the float reference)."""
        out = []
        for i, (p, tid) in enumerate(zip(self.parts, self.type_ids)):
            raw, file_type = gguf_cpu.deinterleave(tid, getattr(self, f"blocks{i}"), p.rows, self.in_features)
            out.append(torch.ops.minillm_gguf.dequantize(raw, file_type, p.rows, self.in_features))
        return torch.cat(out)

    def select_rows(self, rows: torch.Tensor) -> "GGUFLinear":
        """A GGUFLinear of these output rows only (ascending, distinct), their blocks copied unchanged: a
        GGUF row is quantized on its own, so the rows stand for the same weights (a row count that is no
        multiple of 8 takes the row-by-row kernel, which sums in another order)."""
        rows = rows.long().cpu()
        if rows.numel() == 0 or bool((rows[1:] <= rows[:-1]).any()) or rows[0] < 0 or rows[-1] >= self.out_features:
            raise ValueError(f"select_rows: rows must be ascending, distinct and in [0, {self.out_features})")
        names = {v: k for k, v in gguf_cpu.TYPE_IDS.items()}
        parts, start = [], 0
        for i, (p, tid) in enumerate(zip(self.parts, self.type_ids)):
            mine = rows[(rows >= start) & (rows < start + p.rows)] - start
            if mine.numel():
                raw, file_type = gguf_cpu.deinterleave(tid, getattr(self, f"blocks{i}"), p.rows, self.in_features)
                parts.append((names[file_type], raw.reshape(p.rows, -1)[mine]))
            start += p.rows
        return GGUFLinear(self.in_features, parts, bias=None if self.bias is None else self.bias[rows])

    def extra_repr(self) -> str:
        kinds = "+".join(f"{p.type_name}x{p.rows}" for p in self.parts)
        return f"in_features={self.in_features}, out_features={self.out_features}, blocks={kinds}, bias={self.bias is not None}"


# our fused layer -> the GGUF tensors stacked along its rows (and whether RoPE permuted them: llama arch)
LAYER_PLAN = {
    "self_attn.qkv_proj": (("attn_q", "q"), ("attn_k", "k"), ("attn_v", None)),
    "self_attn.o_proj": (("attn_output", None),),
    "mlp.gate_up_proj": (("ffn_gate", None), ("ffn_up", None)),
    "mlp.down_proj": (("ffn_down", None),),
}


def rope_heads(cfg) -> dict[str, int]:
    """LAYER_PLAN's "q"/"k" -> head counts for undoing llama.cpp's RoPE row permutation (llama arch only)."""
    return {"q": cfg.num_attention_heads, "k": cfg.num_key_value_heads} if cfg.model_type == "llama" else {}


def _rows(t, heads: int | None) -> torch.Tensor:
    """A GGUF tensor's bytes as [rows, row bytes], llama.cpp's RoPE row permutation undone when `heads` is given."""
    from minillm.loader.gguf import unpermute_rope_rows

    raw = torch.from_numpy(np.array(t.data)).reshape(int(t.shape[1]), -1)  # np.array: a copy of the mmap rows
    return unpermute_rope_rows(raw, heads) if heads is not None else raw


@torch.no_grad()
def keep_gguf_blocks(model: nn.Module, path: str | Path) -> dict[str, str]:
    """Swap every decoder linear, and the LM head, for a GGUFLinear on the file's own blocks.

    The model was loaded from the same file (dequantized to float); the float
    weights of swapped layers are dropped. A layer with a tensor type the kernels
    lack (Q5_1, Q5_K, F16 ...) stays float. Returns {layer: what happened}.
    """
    from minillm.loader.gguf import FastGGUFReader

    tensors = {t.name: t for t in FastGGUFReader(Path(path)).tensors}
    cfg = model.config
    heads = rope_heads(cfg)
    report: dict[str, str] = {}

    def swap(owner: nn.Module, attr: str, name: str, ts: list, head_of: list) -> None:
        lin = getattr(owner, attr)
        kinds = [t.tensor_type.name if t is not None else "missing" for t in ts]
        k = lin.in_features
        ok = all(kind in gguf_cpu.TYPE_IDS and k % gguf_cpu.activation_block(gguf_cpu.TYPE_IDS[kind]) == 0 for kind in kinds)
        if not ok:
            report[name] = "float (" + "+".join(sorted(set(kinds))) + ")"
            return
        parts = [(t.tensor_type.name, _rows(t, heads.get(h))) for t, h in zip(ts, head_of)]
        if sum(p.shape[0] for _, p in parts) != lin.out_features:
            report[name] = f"float (the file's rows do not match {lin.out_features} outputs)"
            return
        bias = getattr(lin, "bias", None)
        setattr(owner, attr, GGUFLinear(k, parts, bias=bias))
        report[name] = "+".join(sorted(set(kinds))) + " blocks"

    for i, layer in enumerate(model.layers):
        for target, plan in LAYER_PLAN.items():
            parent, _, attr = target.rpartition(".")
            ts = [tensors.get(f"blk.{i}.{p}.weight") for p, _ in plan]
            swap(layer.get_submodule(parent), attr, f"layers.{i}.{target}", ts, [h for _, h in plan])
    # the LM head: its own tensor, or the embedding table when they are tied
    head = tensors.get("output.weight")
    head = head if head is not None else tensors.get("token_embd.weight")
    swap(model, "lm_head", "lm_head", [head], [None])
    report["kernels"] = torch.ops.minillm_gguf.isa()
    return report
