"""W8A8Linear: int8 weights per output channel x int8 activations per token -> an int32 GEMM.

Weight-only int8 (QuantLinear) saves bytes but still multiplies in float.
Here both operands are int8, so the product runs on the integer units
(AVX-512 VNNI on this CPU, int8 tensor cores on a GPU), accumulates exactly in
int32 and is rescaled once per output:

    x[m, k] ~= xq[m, k] * a[m]          a[m] = max_k |x[m, k]| / 127   (per token, computed on the fly)
    w[n, k] ~= wq[n, k] * s[n]          s[n] = max_k |w[n, k]| / 127   (per output channel, once)
    y[m, n]  = (sum_k xq[m, k] wq[n, k]) * a[m] * s[n]        (int32 sum, float rescale)

Per-token activation scales keep one loud token from coarsening the others;
the channels that are loud in every token are what SmoothQuant
(minillm.quant.smoothquant) moves into the weights before this quantization.
Where that move cannot be folded into the previous op, ``input_scale``
(1/s per input channel) multiplies x right before it is quantized (the same
pass over x that finds its scale).

The GEMM is torch._int_mm(xq [M, K], wq.t() [K, N]) -> int32 [M, N]:
- CPU with int8 dot-product instructions (oneDNN): any shape. Measured on this 2-core AMD EPYC (AVX-512 VNNI and
  BF16), 1 thread, the default model's four shapes (`python -m minillm.bench.int8_gemm`):
  at M = 128..512 the int8 GEMM runs 765-897 GOP/s against 87-100 GFLOP/s for
  float32 and 374-443 for bf16, and the whole layer (quantizing x, rescaling y)
  450-574: 5x float32, 1.2-1.35x bf16 -- batched prefill is where it pays. At
  M = 1 the extra passes over x and y eat the gain (20-59 against 26-38 GFLOP/s
  float32). The weight is kept [N, K] row-major and passed transposed, the layout
  the kernel runs fastest at M = 1 (~170 vs ~50 GOP/s for a [K, N] row-major copy).
- CPU without int8 dot-product instructions (no AVX-512 VNNI / AVX-VNNI / AMX, e.g. an
  AVX2-only AMD Zen3): torch._int_mm falls back to a plain loop there, measured 25-40x slower
  than a float32 GEMM of the same shape (M = 1..128, the default model's shapes, 1 thread). So
  the same integer codes are multiplied by the float32 GEMM instead: each product of two int8
  values is exact in float32 and so is every partial sum below 2^24 (K * 127^2 < 2^24 for
  K <= 1040; wider layers can round a sum by one part in 2^24, far below the int8 step).
  `int8_gemm_kernel()` says which one runs; MINILLM_INT8_GEMM=int_mm | float32 forces one.
- CUDA (cuBLASLt): needs M > 16 and K, N multiples of 8, so rows are padded to
  the next multiple of 8 above 16; a layer with K or N not a multiple of 8 raises
  at construction on CUDA rather than silently taking a slow path.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from minillm import envs
from minillm.quant.int8 import quantize_int8
from minillm.host import cpu_flags

INT8_GEMM_ENV = envs.MINILLM_INT8_GEMM
INT8_DOT_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "avx_vnni_int8")  # int8 dot products in hardware


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float -> (int8 codes [M, K], float32 scales [M]); symmetric, -128 unused as in int8.py."""
    # widen first: torch's reductions and mixed-dtype divisions run 3-8x slower on bf16 than on float32 here
    x = x.float()
    # max |x| from the row's max and min: two reductions, no |x| copy (each pass over x costs about as much
    # as the GEMM's own read of it); an all-zero row keeps a scale > 0
    scale = torch.maximum(x.amax(dim=-1), x.amin(dim=-1).neg()).clamp_(min=1e-8).div_(127.0)
    # |x / scale| <= 127 by construction, so no clamp; round in place on the quotient's buffer
    q = torch.div(x, scale[:, None]).round_().to(torch.int8)
    return q, scale


def cuda_rows(m: int) -> int:
    """Rows torch._int_mm accepts on CUDA for m real rows: more than 16, a multiple of 8."""
    return max(24, -(-m // 8) * 8)


@functools.cache
def int8_gemm_kernel() -> str:
    """"int_mm" (torch._int_mm: oneDNN's integer kernels) where this CPU has int8 dot-product
    instructions, else "float32" (the same codes through the float32 GEMM; see the module docstring)."""
    forced = envs.int8_gemm()  # ValueError for another value
    if forced:
        return forced
    units = bool(cpu_flags() & set(INT8_DOT_FLAGS)) or torch.cpu._is_vnni_supported() or torch.cpu._is_amx_tile_supported()
    return "int_mm" if units else "float32"


def int8_matmul(xq: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    """int8 [M, K] x int8 [N, K]^T -> int32 [M, N], exact."""
    if not xq.is_cuda and int8_gemm_kernel() == "float32":
        return int8_matmul_float(xq, wq, "float32").to(torch.int32)
    return _int_mm(xq, wq)


def int8_matmul_float(xq: torch.Tensor, wq: torch.Tensor, cpu_kernel: str) -> torch.Tensor:
    """The same sums as float32 [M, N] (what the layer rescales); `cpu_kernel` from int8_gemm_kernel()."""
    if not xq.is_cuda and cpu_kernel == "float32":
        return torch.mm(xq.float(), wq.float().t())
    return _int_mm(xq, wq).float()


def _int_mm(xq: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    if xq.is_cuda:
        m = xq.shape[0]
        rows = cuda_rows(m)
        if rows != m:
            xq = torch.nn.functional.pad(xq, (0, 0, 0, rows - m))
        return torch._int_mm(xq, wq.t())[:m]
    return torch._int_mm(xq, wq.t())


class W8A8Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        if torch.device(device).type == "cuda" and (in_features % 8 or out_features % 8):
            raise ValueError(f"W8A8 on CUDA needs in/out features that are multiples of 8 (torch._int_mm), "
                             f"got {in_features} x {out_features}")
        self.in_features, self.out_features = in_features, out_features
        self.cpu_kernel = int8_gemm_kernel()  # chosen once (a plain str: torch.compile sees a constant)
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("scales", torch.ones(out_features, device=device))
        self.register_buffer("input_scale", None)  # SmoothQuant's 1/s where it could not be folded
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)

    @classmethod
    def from_float(cls, w: torch.Tensor, bias: torch.Tensor | None = None,
                   input_scale: torch.Tensor | None = None) -> "W8A8Linear":
        q = quantize_int8(w)  # symmetric per output channel, the weight-only int8 grid
        mod = cls(w.shape[1], w.shape[0], bias=bias is not None, device=w.device)
        mod.qweight.copy_(q.qweight)
        mod.scales.copy_(q.scales)
        if bias is not None:
            mod.bias.copy_(bias.float())
        if input_scale is not None:
            mod.input_scale = input_scale.float().clone()
        return mod

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] (times input_scale where set: what x meets before quantization)."""
        w = self.qweight.float() * self.scales[:, None]
        return w if self.input_scale is None else w * self.input_scale[None, :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).float().contiguous()  # a column_major_out layer may hand on a view
        if self.input_scale is not None:
            x2 = x2 * self.input_scale
        xq, xs = quantize_per_token(x2)
        y = int8_matmul_float(xq, self.qweight, self.cpu_kernel).mul_(xs[:, None]).mul_(self.scales)  # in place: no [M, N] temporaries
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def extra_repr(self) -> str:
        smooth = ", input_scale" if self.input_scale is not None else ""
        return f"in={self.in_features}, out={self.out_features}, w8a8{smooth}, cpu_gemm={self.cpu_kernel}"
