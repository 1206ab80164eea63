"""QuantLinear: a linear layer whose weight is stored int8 or packed int4 and
dequantized inside the matmul (weight-only quantization, W8A16 / W4A16).

Not an nn.Linear subclass on purpose: code that rewrites every nn.Linear's
``weight`` (ModelRunner's K-major re-layout) must leave it alone.

Two storage layouts per format:
- "plain": the portable format of minillm.quant.int8 / int4 (int8 rows, or
  nibble-packed int4 with float32 (scale, zero) per group). Forward
  dequantizes to the activation dtype and runs F.linear (the reference path,
  any device), or the Triton kernel on CUDA (kernels/quant_matmul.py).
- "cpu": torch's own CPU kernels (aten._weight_int8pack_mm,
  aten._weight_int4pack_mm_for_cpu). They take bf16 activations and bf16
  scales, so scales are stored bf16 and the activation is cast around the
  call. Measured on this 2-core AMD EPYC (AVX-512), 1 thread, a 1536 x 576 layer: batch 1
  int4 g32 0.3 ms, int8 0.5 ms vs 22-34 ms for dequantize-then-matmul and
  0.4 ms for the float32 K-major BLAS (which streams its 4x more bytes
  faster: the int kernels do not reach the bandwidth roof at batch 1);
  batch 64 on par with float32 (8-9 ms). Shapes the int4 packer refuses
  (N % 16 != 0, odd K) keep the plain layout (cpu_layout_ok).
- "blocks": on a CPU without bf16 instructions (AVX2-only: Zen 2/3, Intel client
  cores) bf16 is emulated and the "cpu" kernels are slow; the same codes are
  re-laid as GGUF Q4_1 / Q8_0 blocks and multiplied by the integer kernels of
  minillm/cpu/kernels/gguf_cpu.py (minillm.quant.cpu_route says which route and why).
"""
from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn import functional as F

from minillm import envs
from minillm.quant.int4 import Int4Weight, check_group_size, dequantize_int4, quantize_int4, unpack_int4
from minillm.quant.int8 import Int8Weight, dequantize_int8, quantize_int8

def cpu_layout_ok(bits: int, out_features: int, in_features: int, group_size: int) -> bool:
    """Can torch's CPU kernels take this shape? (int4 packing needs N % 16 == 0.)"""
    if bits == 8:
        return True
    return out_features % 16 == 0 and in_features % 2 == 0 and group_size in (32, 64, 128, 256)


class QuantLinear(nn.Module):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bits: int,
        group_size: int | None = None,
        bias: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        if bits not in (4, 8):
            raise ValueError(f"QuantLinear supports 4 or 8 bits, got {bits}")
        if bits == 4:
            if group_size is None:
                raise ValueError("int4 needs a group_size")
            check_group_size(in_features, group_size)
        self.in_features, self.out_features, self.bits = in_features, out_features, bits
        self.group_size = group_size if bits == 4 else in_features
        self.layout = "plain"
        if bits == 8:
            self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
            self.register_buffer("scales", torch.ones(out_features, device=device))
        else:
            self.register_buffer("qweight", torch.zeros(out_features, (in_features + 1) // 2, dtype=torch.uint8, device=device))
            self.register_buffer("scale_zeros", torch.zeros(in_features // group_size, out_features, 2, device=device))
        # AWQ: x is multiplied by this per-input-channel factor before the matmul when
        # the search's scale could not be folded into the previous op (None: nothing to do)
        self.register_buffer("input_scale", None)
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)

    # ----- construction ------------------------------------------------------------------------
    @classmethod
    def from_float(
        cls, w: torch.Tensor, bits: int, group_size: int | None = None, bias: torch.Tensor | None = None,
        input_scale: torch.Tensor | None = None,
    ) -> "QuantLinear":
        """Quantize a float weight [out, in] with round-to-nearest."""
        n, k = w.shape
        q = quantize_int8(w) if bits == 8 else quantize_int4(w, group_size) if bits == 4 else None
        if q is None:
            raise ValueError(f"QuantLinear supports 4 or 8 bits, got {bits}")
        return cls.from_quantized(q, bias=bias, input_scale=input_scale)

    @classmethod
    def from_quantized(
        cls, q: Int8Weight | Int4Weight, bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None
    ) -> "QuantLinear":
        if isinstance(q, Int8Weight):
            mod = cls(q.qweight.shape[1], q.qweight.shape[0], 8, bias=bias is not None, device=q.qweight.device)
            mod.qweight.copy_(q.qweight)
            mod.scales.copy_(q.scales)
        else:
            mod = cls(q.in_features, q.qweight.shape[0], 4, q.group_size, bias=bias is not None, device=q.qweight.device)
            mod.qweight.copy_(q.qweight)
            mod.scale_zeros.copy_(q.scale_zeros)
        if bias is not None:
            mod.bias.copy_(bias.float())
        if input_scale is not None:
            mod.input_scale = input_scale.float().clone()
        return mod

    @torch.no_grad()
    def use_cpu_kernels(self, route: str | None = None) -> bool:
        """Re-lay the weight for this CPU's kernels; False if the shape does not allow it.

        route: "bf16" (torch's int8/int4 kernels, bf16 activations) or "blocks" (GGUF blocks and
        integer kernels); None asks minillm.quant.cpu_route, which decides by the CPU's features."""
        if self.layout in ("cpu", "blocks"):
            return True
        if self.qweight.device.type != "cpu":
            return False
        if route is None:
            from minillm.quant.cpu_route import quant_cpu_route

            route = quant_cpu_route()[0]
        if route == "blocks" and self.in_features % 32 == 0:
            return self._use_blocks()
        if not cpu_layout_ok(self.bits, self.out_features, self.in_features, self.group_size):
            return False
        if self.bits == 8:
            self.scales = self.scales.to(torch.bfloat16)
        else:
            codes = unpack_int4(self.qweight, self.in_features).to(torch.int32)
            self.qweight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
            self.scale_zeros = self.scale_zeros.to(torch.bfloat16)
        self.layout = "cpu"
        return True

    def _use_blocks(self) -> bool:
        from minillm.cpu.kernels import gguf_cpu
        from minillm.quant.cpu_route import int4_as_q4_1, int8_as_q8_0

        gguf_cpu.load()  # GGUFKernelUnavailable here, not at the first forward
        if self.bits == 8:
            blocks, type_name = int8_as_q8_0(self.qweight, self.scales), "Q8_0"
        else:
            codes = unpack_int4(self.qweight, self.in_features)
            blocks, type_name = int4_as_q4_1(codes, self.scale_zeros, self.group_size), "Q4_1"
        self.block_type = gguf_cpu.TYPE_IDS[type_name]
        # the blocks hold the codes and the (fp16) scales: the float32 copies go
        self.qweight = blocks
        if self.bits == 8:
            self.scales = torch.empty(0)
        else:
            self.scale_zeros = torch.empty(0)
        self.layout = "blocks"
        return True

    # ----- use ---------------------------------------------------------------------------------
    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] this layer computes with (up to the activation dtype)."""
        if self.layout == "blocks":
            return torch.ops.minillm_gguf.dequantize(self.qweight.reshape(-1), self.block_type, self.out_features,
                                                     self.in_features)
        if self.bits == 8:
            return dequantize_int8(self.qweight, self.scales)
        if self.layout == "plain":
            return dequantize_int4(self.qweight, self.scale_zeros, self.group_size, self.in_features)
        # torch's tiled CPU layout has no public unpacker: multiply the identity (exact in float32)
        eye = torch.eye(self.in_features, device=self.qweight.device)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.qweight, self.group_size, self.scale_zeros.float()).t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).contiguous()  # a column_major_out layer may hand on a transposed view
        if self.input_scale is not None:
            x2 = x2 * self.input_scale.to(x2.dtype)
        if self.layout == "blocks":
            # int8 activation blocks x the weight's blocks, integer dot products (no bf16 anywhere)
            y = torch.ops.minillm_gguf.linear(x2, [self.qweight], [self.block_type], None)
            y = y if y.dtype == x.dtype else y.to(x.dtype)
        elif self.layout == "cpu":
            xb = x2 if x2.dtype == torch.bfloat16 else x2.to(torch.bfloat16)  # (what torch's kernels take)
            if self.bits == 8 and x2.shape[0] == 1 and torch.compiler.is_compiling():
                y = _int8_gemv(x2, self.qweight, self.scales)  # fp32 activations; inductor drops the unused cast
            elif self.bits == 8:
                y = torch.ops.aten._weight_int8pack_mm(xb, self.qweight, self.scales)
            else:
                y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.qweight, self.group_size, self.scale_zeros)
            y = y if y.dtype == x.dtype else y.to(x.dtype)
        elif x2.is_cuda and cuda_matmul_path() == "triton":
            from minillm.kernels.quant_matmul import w4a16_matmul, w8a16_matmul

            if self.bits == 8:
                y = w8a16_matmul(x2, self.qweight, self.scales)
            else:
                y = w4a16_matmul(x2, self.qweight, self.scale_zeros, self.group_size)
        else:  # the reference layout off CUDA, or CUDA with the fallback chosen explicitly
            y = F.linear(x2, self.dequantize().to(x2.dtype))
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        """Bytes of every tensor this layer keeps (weight codes, scales, zeros, bias, input scale)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def extra_repr(self) -> str:
        g = f", group_size={self.group_size}" if self.bits == 4 else ""
        awq = ", input_scale" if self.input_scale is not None else ""
        return f"in={self.in_features}, out={self.out_features}, bits={self.bits}{g}, layout={self.layout}{awq}"


def _int8_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """One row times an int8 [N, K] weight, written as a multiply-and-sum so that inductor
    fuses the int8->float conversion into one vectorised pass over the codes (batch-1
    decode only: eager would materialise N x K floats). Measured on this CPU, 1 thread,
    the 49152 x 576 LM head: 2.4 ms vs 4.8 ms for aten._weight_int8pack_mm, which
    converts the activation to bf16 and is compute-bound at batch 1."""
    y = (x.float()[:, None, :] * qweight.float()[None]).sum(-1) * scales.float()
    return y.to(x.dtype)


DEQUANT_FALLBACK_ENV = envs.MINILLM_QUANT_DEQUANT_FALLBACK
_warned_fallback = False


def _triton_error() -> str | None:
    """Why the Triton dequant-matmul kernels cannot be used here, or None when they can."""
    try:
        import minillm.kernels.quant_matmul  # noqa: F401
    except Exception as e:  # no triton, or a triton that cannot build for this GPU
        return f"{type(e).__name__}: {e}"
    return None


def cuda_matmul_path() -> str:
    """How a quantized layer multiplies on CUDA: "triton" (the fused dequant-matmul kernels), or
    "dequantize" (the whole weight dequantized on every call: many times slower) only when
    MINILLM_QUANT_DEQUANT_FALLBACK=1 asks for it; otherwise a missing kernel is an error."""
    global _warned_fallback
    err = _triton_error()
    if err is None:
        return "triton"
    if envs.quant_dequant_fallback():
        if not _warned_fallback:
            warnings.warn(f"quantized layers on CUDA dequantize their whole weight on every call "
                          f"(the Triton kernels are unavailable: {err})", RuntimeWarning, stacklevel=3)
            _warned_fallback = True
        return "dequantize"
    raise RuntimeError(f"the Triton dequant-matmul kernels for quantized layers on CUDA are unavailable ({err}); "
                       f"install a Triton that supports this GPU, or set {DEQUANT_FALLBACK_ENV}=1 to dequantize "
                       f"the whole weight on every call (slow)")
