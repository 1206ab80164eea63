"""Triton W8A16 / W4A16 dequantize-matmul against their PyTorch references (interpreter on CPU), and a GPU compile."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from minillm.kernels.quant_matmul import w4a16_matmul, w4a16_matmul_ref, w8a16_matmul, w8a16_matmul_ref
from minillm.quant import quantize_int4, quantize_int8


def _x(m: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(m + k)).to(dtype)


@pytest.mark.parametrize("m,n,k", [(1, 80, 96), (19, 64, 64), (3, 17, 200)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a16_matches_reference(m, n, k, dtype):
    q = quantize_int8(torch.randn(n, k, generator=torch.Generator().manual_seed(n)) * 0.05)
    x = _x(m, k, dtype)
    got, ref = w8a16_matmul(x, q.qweight, q.scales), w8a16_matmul_ref(x, q.qweight, q.scales)
    assert got.dtype == dtype and got.shape == (m, n)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), ref.float(), atol=tol * ref.float().abs().max().item(), rtol=0)


@pytest.mark.parametrize("m,n,k,group", [(1, 80, 128, 32), (19, 48, 128, 64), (5, 33, 256, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w4a16_matches_reference(m, n, k, group, dtype):
    q = quantize_int4(torch.randn(n, k, generator=torch.Generator().manual_seed(n)) * 0.05, group)
    x = _x(m, k, dtype)
    got = w4a16_matmul(x, q.qweight, q.scale_zeros, group)
    ref = w4a16_matmul_ref(x, q.qweight, q.scale_zeros, group)
    assert got.dtype == dtype and got.shape == (m, n)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), ref.float(), atol=tol * ref.float().abs().max().item(), rtol=0)


def test_bad_shapes_are_refused():
    q = quantize_int4(torch.randn(16, 64), 32)
    with pytest.raises(ValueError, match="divisible by the group"):
        w4a16_matmul(torch.randn(2, 64), q.qweight, q.scale_zeros, 128)
    with pytest.raises(ValueError, match="int8 weight"):
        w8a16_matmul(torch.randn(2, 64), q.qweight, torch.ones(16))


@pytest.mark.slow
def test_quant_kernels_compile_for_gpu(tmp_path):
    out = tmp_path / "rows.json"
    code = f"""
import json, torch
from minillm.kernels._common import gpu_compile
from minillm.kernels.quant_matmul import gpu_compile_specs
rows = []
for dtype in (torch.bfloat16, torch.float16):
    for g in (32, 128):
        for name, fn, sig, opts in gpu_compile_specs(dtype, g):
            for arch in (80, 90):
                k = gpu_compile(fn, sig, arch, **opts)
                rows.append(dict(kernel=name, arch=arch, cubin="cubin" in k.asm, shared=k.metadata.shared))
json.dump(rows, open({str(out)!r}, "w"))
"""
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "0"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 16 and all(r["cubin"] for r in rows), rows
    assert max(r["shared"] for r in rows) <= 99 * 1024
