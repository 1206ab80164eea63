"""FP8Linear: e4m3 weights with one scale per output channel (W8, float8_e4m3fn storage).

    w[n, k] ~= e4m3(w[n, k] / s[n]) * s[n],      s[n] = max_k |w[n, k]| / 448   (448: e4m3's largest value)

e4m3 keeps 3 mantissa bits at every magnitude, so a weight is rounded to
within 1/16 of itself (2^-4 relative) down to 2^-6 * s[n], and to within 2^-10 * s[n]
below that (subnormals) -- a floating-point grid, finer than int8's near zero
and coarser near the row's maximum.

How it multiplies depends on the device, and is stated, not hidden:

- CUDA, compute capability 9.0+ (Hopper): the activation is quantized to e4m3
  per token on the fly (amax / 448) and torch._scaled_mm multiplies the two fp8
  operands on the tensor cores with row-wise scales (scale_a [M, 1], scale_b
  [1, N]), bf16 out. Needs K and N multiples of 16 (checked at construction on CUDA).
  This path is exercised on CPU in the tests (torch._scaled_mm exists there too)
  but has not been run on a GPU in this project's CI.
- Everywhere else (this CPU; older GPUs): the weight is *stored* as fp8 and
  *dequantized on every call*: the codes go through a 256-entry table of their
  exact values (0.7 ms for a 960 x 576 layer here, 4x faster than torch's fp8->float
  cast), the product runs in float32 and the per-channel scale multiplies the
  output. fp8 on CPU saves memory (1 byte per weight) but costs time: measured on this
  CPU, 1 thread, the default model's qkv layer (960 x 576) at batch 1, ~0.9 ms against
  ~0.06 ms for the float32 K-major product (`python -m minillm.bench.int8_gemm`; `minillm
  bench quant` shows it end to end). There is no fp8 arithmetic on this CPU;
  torch._scaled_mm on CPU measured slower still (2.5 ms).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (e4m3 codes [N, K], float32 scales [N])."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"fp8 quantization needs a 2-D float weight, got {tuple(w.shape)} {w.dtype}")
    w = w.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / E4M3_MAX
    return (w / scales[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scales


def e4m3_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """The float32 value of each of the 256 e4m3 bit patterns (two are NaN and never stored)."""
    return torch.arange(256, dtype=torch.uint8, device=device).view(E4M3).float()


def scaled_mm_path(device: torch.device) -> bool:
    """Does this device multiply fp8 natively (torch._scaled_mm with row-wise scales)? CUDA sm90+ only."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def fp8_scaled_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] float -> bf16 [M, N]: x quantized to e4m3 per token, torch._scaled_mm with row-wise scales."""
    x = x.float()
    xs = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / E4M3_MAX  # [M, 1]
    xq = (x / xs).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return torch._scaled_mm(xq, qweight.t(), scale_a=xs, scale_b=scales[None, :].float().contiguous(),
                            out_dtype=torch.bfloat16)


class FP8Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        if torch.device(device).type == "cuda" and (in_features % 16 or out_features % 16):
            raise ValueError(f"fp8 on CUDA needs in/out features that are multiples of 16 (torch._scaled_mm), "
                             f"got {in_features} x {out_features}")
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=E4M3, device=device))
        self.register_buffer("scales", torch.ones(out_features, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)
        self._table: torch.Tensor | None = None  # e4m3_table, made on first use (not a buffer: not stored)

    @classmethod
    def from_float(cls, w: torch.Tensor, bias: torch.Tensor | None = None) -> "FP8Linear":
        q, s = quantize_fp8(w)
        mod = cls(w.shape[1], w.shape[0], bias=bias is not None, device=w.device)
        mod.qweight.copy_(q)
        mod.scales.copy_(s)
        if bias is not None:
            mod.bias.copy_(bias.float())
        return mod

    def codes_as_float(self) -> torch.Tensor:
        """The stored e4m3 values as float32 [N, K], unscaled (the table lookup of the CPU path)."""
        if self._table is None or self._table.device != self.qweight.device:
            self._table = e4m3_table(self.qweight.device)
        idx = self.qweight.view(torch.uint8).reshape(-1).int()
        return self._table.index_select(0, idx).view(self.out_features, self.in_features)

    def dequantize(self) -> torch.Tensor:
        return self.codes_as_float() * self.scales[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).contiguous()  # a column_major_out layer may hand on a transposed view
        if scaled_mm_path(x2.device):
            y = fp8_scaled_matmul(x2, self.qweight, self.scales)
        else:  # dequantize on every call (see the module docstring): the scale goes on the output
            y = F.linear(x2.float(), self.codes_as_float()) * self.scales
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, fp8 e4m3 per channel"


@torch.no_grad()
def fp8_quantize_model(model) -> None:
    """quantization="fp8": every target linear (minillm.quant.targets.TARGETS) becomes an FP8Linear."""
    from minillm.quant.targets import replace_module, target_linears

    for name, lin in target_linears(model).items():
        w = lin.weight.detach().float().contiguous()
        replace_module(model, name, FP8Linear.from_float(w, lin.bias.detach() if lin.bias is not None else None))
