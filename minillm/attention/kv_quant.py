"""Quantized KV cache: int8 or fp8 (e4m3) values with one scale per (token, kv head).

Scheme (symmetric, per token per head). For the ``head_dim`` values ``x`` of
one kv head of one token, ``amax = max |x|`` and

* int8: ``scale = amax / 127``, ``q = clamp(round(x / scale), -127, 127)``
  (round half to even), ``x_hat = q * scale``; ``|x - x_hat| <= scale / 2 =
  amax / 254``.
* fp8 e4m3: ``scale = amax / 448`` (448 is e4m3's largest finite value),
  ``q = fp8(x / scale)`` (round to nearest even), ``x_hat = q * scale``;
  relative error <= 2^-4 for |x / scale| >= 2^-6, absolute error <= 2^-10 *
  scale below that (e4m3 subnormals).

A head whose values are all zero gets scale 1 (q = 0, no division by zero).
Scales are float32 ``[num_blocks, block_size, kv_heads]``, so one token costs
``kv_heads * (head_dim + 4)`` bytes per layer for K and again for V instead of
``kv_heads * head_dim * 2`` (bf16) or ``* 4`` (fp32).

Why per token: a token's K/V are written once and never change, so its scale
can be fixed at store time from that token alone -- no calibration, no
rescaling of older tokens as new ones arrive (a per-block or per-tensor scale
would need one of the two). Why per head: heads differ in magnitude by orders
of magnitude (RoPE'd keys have outlier channels per head).

fp8 storage: the pool is a ``torch.float8_e4m3fn`` tensor; the torch path
copies and gathers it through a ``uint8`` view (CPU ``index_copy_`` has no
fp8 kernel), and the Triton kernels read/write the same bits as ``uint8`` and
convert by hand (the interpreter's fp8 cast truncates, and sm80 has no fp8
conversion instructions), bit-exactly matching torch's conversion.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# kv_cache_dtype name -> storage dtype; "auto" keeps the model's dtype (no scales)
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None, "int8": torch.int8, "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
}
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
SCALE_DTYPE = torch.float32


def resolve_kv_cache_dtype(name: str) -> torch.dtype | None:
    """'auto' -> None (model dtype); 'int8' -> torch.int8; 'fp8'/'fp8_e4m3' -> torch.float8_e4m3fn."""
    if not isinstance(name, str) or name not in KV_CACHE_DTYPES:
        raise ValueError(f"unsupported kv_cache_dtype {name!r}; choose one of {sorted(KV_CACHE_DTYPES)}")
    return KV_CACHE_DTYPES[name]


def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in QMAX


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """K and V of one token over all layers, scales included for a quantized dtype."""
    elem = torch.empty((), dtype=dtype).element_size()
    per_head = head_dim * elem + (torch.empty((), dtype=SCALE_DTYPE).element_size() if is_quantized(dtype) else 0)
    return 2 * num_layers * num_kv_heads * per_head


@dataclass(frozen=True)
class KVMemoryRow:
    """What one kv_cache_dtype buys within a fixed KV budget (the engine's plan_kv_cache arithmetic)."""

    kv_cache_dtype: str
    storage_dtype: str
    bytes_per_token: int  # K and V over all layers, scales included
    num_blocks: int
    max_tokens: int
    max_seqs: int  # concurrent sequences of seq_len tokens, each holding whole blocks


def kv_memory_table(num_layers: int, num_kv_heads: int, head_dim: int, model_dtype: torch.dtype, budget_bytes: int,
                    seq_len: int, block_size: int = 16,
                    names: tuple[str, ...] = ("auto", "int8", "fp8")) -> list[KVMemoryRow]:
    """Bytes per token, blocks and concurrent ``seq_len``-token sequences per kv_cache_dtype for one budget."""
    if budget_bytes <= 0 or seq_len <= 0 or block_size <= 0:
        raise ValueError(f"budget_bytes, seq_len and block_size must be positive, got {budget_bytes}, {seq_len}, "
                         f"{block_size}")
    rows = []
    for name in names:
        dtype = resolve_kv_cache_dtype(name) or model_dtype
        per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
        blocks = budget_bytes // (per_token * block_size)
        rows.append(KVMemoryRow(name, str(dtype).removeprefix("torch."), per_token, blocks, blocks * block_size,
                                blocks // -(-seq_len // block_size)))
    return rows


def quantize_kv(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, kv_heads, head_dim] -> (values [T, kv_heads, head_dim] in ``dtype``, scales [T, kv_heads] fp32)."""
    qmax = QMAX[dtype]
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    y = (xf / scale.unsqueeze(-1)).clamp(-qmax, qmax)  # clamp: x / (amax / qmax) can round past qmax
    if dtype == torch.int8:
        return y.round().to(torch.int8), scale
    return y.to(dtype), scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values [..., head_dim] (int8 or fp8), scales [...] -> values * scale in ``dtype``."""
    return (q.float() * scale.unsqueeze(-1)).to(dtype)


def as_bits(cache: torch.Tensor) -> torch.Tensor:
    """The tensor index ops and Triton see: fp8 pools through a uint8 view, others as they are."""
    return cache.view(torch.uint8) if cache.dtype == torch.float8_e4m3fn else cache
