"""Which kernels a quantized int8/int4 layer multiplies with on this CPU, and the CPU features behind it.

Two routes for the same codes:

- "bf16": torch's CPU weight-only kernels (aten._weight_int8pack_mm,
  _weight_int4pack_mm_for_cpu), which take bf16 activations. With bf16 instructions
  (AVX-512 BF16, AMX) the conversions are native; on AVX2-only CPUs (AMD Zen 2/3, Intel
  client cores) they are emulated (shifts), and batch-1 int4 decode of the default model
  ran at 0.30x llama.cpp on a Zen3 (issue 20).
- "blocks": the codes re-laid as GGUF blocks and multiplied by the integer kernels of
  minillm/cpu/kernels/gguf_cpu.py (activations rounded to int8 per 32 values, integer dot products,
  as llama.cpp does) -- no bf16 anywhere:

    int4, groups of 32..256: w = (q - 8) * s + z  ->  Q4_1 blocks of 32: w = q * d + m,
                              d = s, m = z - 8 s (each group's (d, m) repeated per 32 weights)
    int8, per output channel: w = q * s           ->  Q8_0 blocks of 32: w = q * d, d = s

The codes are the same; d and m are stored as fp16 (GGUF's format), a relative
rounding of 2^-11 on each scale, well below the int4 step. The activation is the one
new rounding (about 0.5-0.7% of a product's norm, as for quantization="gguf").

Which is faster was measured, not assumed, on both kinds of machine (batch-1 decode of the
default model, int4 g32 + int8 head, eager, 2 threads, `minillm bench latency`):

- a real AVX2-only CPU (2-core AMD EPYC Zen3: AVX2/FMA/F16C, no AVX-512, no bf16 instructions;
  torch's bf16 matmul roof there is 20 GFLOP/s against 105 in fp32), two alternating pairs:
  "blocks" 28.3 / 33.7 tok/s against "bf16" 24.4 / 28.5 (x1.16 / x1.18), 1k-token prefill level
  (5.4 / 4.5 s against 5.1 / 4.7 s). So a CPU without bf16 hardware takes "blocks".
- a Xeon with AMX told to run torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2, one thread):
  "bf16" 34.2 / 37.3 tok/s against "blocks" 29.8 / 28.0 -- the bf16 hardware still helps torch's
  kernels there (oneDNN keeps its own ISA), so that case stays on "bf16", as do CPUs with native
  bf16 (AVX-512 BF16, AMX).

MINILLM_QUANT_CPU_ROUTE=bf16 | blocks overrides the choice. The features are detected and recorded
(quantization_report["kernels"], the bench JSON's machine record).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm import envs

ROUTE_ENV = envs.MINILLM_QUANT_CPU_ROUTE
ROUTES = envs.QUANT_CPU_ROUTES


@dataclass(frozen=True)
class CpuFeatures:
    """What decides the route: torch's kernel level and the CPU's bf16 instructions."""

    torch_capability: str  # torch.backends.cpu.get_cpu_capability(): "AVX512", "AVX2", "DEFAULT", ...
    avx512_bf16: bool
    amx: bool

    @property
    def native_bf16(self) -> bool:
        """bf16 products in hardware *and* torch running kernels that use them."""
        return self.torch_capability not in ("AVX2", "DEFAULT", "NO AVX") and (self.avx512_bf16 or self.amx)


def cpu_features() -> CpuFeatures:
    cap = torch.backends.cpu.get_cpu_capability()
    bf16 = bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())
    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    return CpuFeatures(cap, bf16, amx)


def quant_cpu_route() -> tuple[str, str]:
    """("bf16" | "blocks", why) for int8/int4 layers on this CPU."""
    forced = envs.quant_cpu_route()  # ValueError for another value
    if forced:
        if forced == "blocks":
            ok, why = _blocks_available()
            if not ok:
                raise RuntimeError(f"{ROUTE_ENV}=blocks, but the GGUF block kernels are unavailable: {why}")
        return forced, f"{ROUTE_ENV}={forced}"
    feats = cpu_features()
    if feats.native_bf16:
        return "bf16", f"native bf16 ({'AMX' if feats.amx else 'AVX-512 BF16'}, torch {feats.torch_capability})"
    if feats.avx512_bf16 or feats.amx:
        # bf16 hardware, torch told to use its AVX2 kernels: measured faster on "bf16" (module docstring)
        return "bf16", (f"bf16 hardware with torch limited to {feats.torch_capability} kernels: measured faster "
                        f"at batch-1 decode than the block kernels")
    ok, reason = _blocks_available()
    if not ok:
        return "bf16", f"no bf16 hardware, but the block kernels are unavailable ({reason}): emulated bf16"
    # measured on an AVX2-only Zen3 (module docstring): the integer block kernels decode faster
    return "blocks", f"no bf16 hardware (torch {feats.torch_capability}): integer GGUF block kernels"


def _blocks_available() -> tuple[bool, str]:
    from minillm.cpu.kernels.gguf_cpu import available

    return available()


def _fp16_bytes(t: torch.Tensor) -> torch.Tensor:
    """float -> fp16 -> its two little-endian bytes, as GGUF stores a ggml_half ([..., 2] uint8)."""
    return t.to(torch.float16).contiguous().view(torch.uint8).reshape(*t.shape, 2)


def int4_as_q4_1(codes: torch.Tensor, scale_zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """int4 codes [N, K] (0..15) and (scale, zero) [K/g, N, 2] -> Q4_1 blocks [N, K/32 * 20] uint8.

    A Q4_1 block: fp16 d, fp16 m, then 16 bytes whose low nibbles are weights 0..15 and
    high nibbles weights 16..31 of the block."""
    n, k = codes.shape
    if k % 32 or group_size % 32:
        raise ValueError(f"Q4_1 blocks need K and the group size to be multiples of 32, got K={k}, group {group_size}")
    per_group = group_size // 32
    scale = scale_zeros[..., 0].t().repeat_interleave(per_group, dim=1)  # [N, K/32]
    zero = scale_zeros[..., 1].t().repeat_interleave(per_group, dim=1)
    q = codes.to(torch.uint8).reshape(n, k // 32, 32)
    qs = q[..., :16] | (q[..., 16:] << 4)
    blocks = torch.cat([_fp16_bytes(scale), _fp16_bytes(zero - 8 * scale), qs], dim=-1)  # [N, K/32, 20]
    return blocks.reshape(n, -1).contiguous()


def float_as_q8_0(weight: torch.Tensor) -> torch.Tensor:
    """float [N, K] -> Q8_0 blocks [N, K/32 * 34] uint8, as llama.cpp quantizes a row: per 32 weights
    d = max|w| / 127 (stored fp16), codes round(w / d) in [-127, 127]; a block of zeros gets d = 0."""
    n, k = weight.shape
    if k % 32:
        raise ValueError(f"Q8_0 blocks need K to be a multiple of 32, got {k}")
    w = weight.detach().float().reshape(n, k // 32, 32)
    d = w.abs().amax(-1) / 127
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    codes = torch.round(w * inv[..., None]).clamp(-127, 127).to(torch.int8)
    return torch.cat([_fp16_bytes(d), codes.view(torch.uint8)], dim=-1).reshape(n, -1).contiguous()


def int8_as_q8_0(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] with one scale per row -> Q8_0 blocks [N, K/32 * 34] uint8 (fp16 d, 32 int8 codes)."""
    n, k = qweight.shape
    if k % 32:
        raise ValueError(f"Q8_0 blocks need K to be a multiple of 32, got {k}")
    d = _fp16_bytes(scales.float()[:, None].expand(n, k // 32))
    qs = qweight.contiguous().view(torch.uint8).reshape(n, k // 32, 32)
    return torch.cat([d, qs], dim=-1).reshape(n, -1).contiguous()
