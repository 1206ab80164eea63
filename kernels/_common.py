"""Small helpers shared by the kernels: interpreter detection, padding, casts, roofs."""
from __future__ import annotations

import os

import torch

# TRITON_INTERPRET=1 (the interpreter, when there is no GPU and the variable is
# unset) is chosen in minillm/kernels/__init__.py, which Python runs before this
# and every other kernel module, so before triton is imported here.
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
if _INTERPRET and not type(tl.cdiv).__name__ == "InterpretedFunction":
    raise ImportError(
        "triton was imported before TRITON_INTERPRET=1 was set, so its helpers were built for a GPU; "
        "set TRITON_INTERPRET=1 in the environment (or import minillm.kernels before triton)"
    )

# log2(e): the kernels' online softmax works in base 2 (exp2), so the host-side
# wrappers pass qk_scale = scale * LOG2E. A plain float, never read inside @triton.jit.
LOG2E = 1.4426950408889634

# torch dtype -> the pointer type string triton.compile's signature expects
TRITON_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}


def interpreting() -> bool:
    """True when this process's kernels were built for the Triton interpreter (CPU tensors, numpy math)."""
    return _INTERPRET


def next_pow2(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum): tile sides must be powers of two."""
    n = max(n, minimum)
    return 1 << (n - 1).bit_length()


def compute_in_f32(dtype: torch.dtype) -> bool:
    """Whether a kernel should widen loaded tiles to fp32 before any math.

    The interpreter stores bf16 as raw uint16 and gets bf16 arithmetic (and
    tl.dot) silently wrong, so there everything is widened right after the
    load. On a GPU, fp16/bf16 tiles stay narrow for tensor-core tl.dot with an
    fp32 accumulator; fp32 caches are widened trivially (they already are).
    """
    return interpreting() or dtype == torch.float32


# Fixed when the kernels are defined: triton.jit picks the interpreter at decoration time too.
INTERPRET = tl.constexpr(_INTERPRET)


@triton.jit
def cast_out(x, dtype: tl.constexpr):
    """Cast an fp32 tile to a storage dtype, rounding to nearest-even.

    The GPU's fp32 -> bf16 conversion rounds to nearest-even; the interpreter
    truncates, which biases every stored bf16 value by up to one ulp. Under the
    interpreter, round by hand on the bit pattern (add half an ulp, ties to
    even, keep the top 16 bits).
    """
    if INTERPRET and dtype == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


def measure_roofs(device: str = "cuda", dtype: torch.dtype = torch.bfloat16) -> dict:
    """Measured (not looked-up) device roofs: copy bandwidth and matmul throughput."""
    import triton.testing

    n = 1 << 28  # 256 Mi elements of fp32 = 1 GiB: far beyond any cache
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=5, rep=50)
    copy_gbs = 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9  # read + write
    del src, dst
    m = 8192
    a = torch.randn(m, m, dtype=dtype, device=device)
    b = torch.randn(m, m, dtype=dtype, device=device)
    ms = triton.testing.do_bench(lambda: a @ b, warmup=5, rep=50)
    tflops = 2 * m**3 / (ms * 1e-3) / 1e12
    return {"copy_GBps": copy_gbs, "matmul_TFLOPs": tflops, "matmul_dtype": str(dtype)}


def gpu_compile(fn, sig: dict, arch: int, num_warps: int = 4, num_stages: int = 2):
    """Compile a @triton.jit kernel for an NVIDIA target without a GPU (sm ``arch``).

    ``sig`` maps every argument name to a triton type string ("*bf16", "i32",
    "fp32"), "i32:16" for an int known to be a multiple of 16, or a plain
    Python value for constexprs (including unit strides, which the JIT would
    also specialize to constants). Pointers get the 16-byte alignment hint the
    JIT gives torch allocations. Returns triton's CompiledKernel (``.asm`` holds
    ttir/ttgir/llir/ptx and, when ptxas is found, cubin).
    """
    import triton
    from triton.backends.compiler import GPUTarget

    names = list(fn.arg_names)
    missing = set(names) ^ set(sig)
    assert not missing, f"signature mismatch for {fn.__name__}: {sorted(missing)}"
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(names):
        t = sig[name]
        if isinstance(t, str) and (t.startswith("*") or t in ("i32", "i64", "fp32", "i32:16")):
            signature[name] = t.split(":")[0]
            if t.startswith("*") or t.endswith(":16"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "constexpr"
            constexprs[name] = t
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})
