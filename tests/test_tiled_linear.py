"""The batched float32 linear (minillm/cpu/kernels/tiled_f32.cpp) against float64, and where SkinnyLinear runs it."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from minillm.cpu.kernels import tiled_cpu
from minillm.cpu.skinny_linear import SkinnyLinear, use_skinny_linears

needs_kernel = pytest.mark.skipif(not tiled_cpu.available(), reason="the tiled kernel could not be built here")


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().t()
    return y if b is None else y + b.double()


@needs_kernel
@pytest.mark.parametrize("rows", [24, 33, 47, 64, 100, 192])  # whole, half and partial row blocks
@pytest.mark.parametrize("in_out", [(576, 960), (1536, 576), (40, 13), (2100, 7)])  # tile remainders; in > KC
@pytest.mark.parametrize("bias", [False, True])
def test_tiled_kernel_equals_float64_reference_in_both_layouts(rows, in_out, bias):
    k, n = in_out
    torch.manual_seed(rows * n + k)
    x, w = torch.randn(rows, k), torch.randn(n, k)
    b = torch.randn(n) if bias else None
    ref = reference(x, w, b)
    tol = dict(rtol=1e-5, atol=1e-4 * k ** 0.5)
    row_major = tiled_cpu.linear(x, w, b, row_major_out=True)
    assert row_major.shape == (rows, n) and row_major.is_contiguous()
    torch.testing.assert_close(row_major.double(), ref, **tol)
    transposed = tiled_cpu.linear(x, w, b, row_major_out=False)
    assert transposed.shape == (n, rows) and transposed.is_contiguous()
    torch.testing.assert_close(transposed.t().double(), ref, **tol)
    # an input in the column-major layout a column_major_out layer hands on: the same sums, the same floats
    x_col = x.t().contiguous().t()
    assert x_col.stride() == (1, rows)
    assert torch.equal(tiled_cpu.linear(x_col, w, b, row_major_out=True), row_major)


@needs_kernel
def test_tiled_kernel_refuses_what_it_cannot_do():
    with pytest.raises(RuntimeError, match="float32"):
        tiled_cpu.linear(torch.randn(40, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"x \[M, K\]"):
        tiled_cpu.linear(torch.randn(40, 8), torch.randn(4, 9))
    with pytest.raises(RuntimeError, match="contiguous"):
        tiled_cpu.linear(torch.randn(40, 8), torch.randn(8, 4).t())


@needs_kernel
@pytest.mark.parametrize("vendor", ["amd", "intel", "other"])
def test_the_kernel_takes_the_rows_it_was_measured_faster_at_on_each_cpu(vendor, monkeypatch):
    monkeypatch.setattr(tiled_cpu, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(tiled_cpu, "outruns_mkl", lambda: False)  # a Zen 4 or a Xeon: MKL keeps prefill's rows
    monkeypatch.delenv("MINILLM_TILED", raising=False)
    tiled_cpu.row_limits.cache_clear()
    try:
        def takes(rows, weight):
            return tiled_cpu.applies(rows, torch.randn(rows, 64), weight)

        narrow, wide = torch.randn(64, 64), torch.randn(tiled_cpu.WIDE * 64, 64)
        lo = tiled_cpu.MIN_ROWS
        assert not takes(lo - 1, narrow) and not takes(lo - 1, wide)  # below: the few-row kernel
        if vendor == "intel":  # MKL's own sgemm wins all but the wide layers' 24-64 rows
            assert takes(lo, wide) and takes(64, wide) and not takes(65, wide) and not takes(2048, wide)
            assert not takes(lo, narrow)
            monkeypatch.setenv("MINILLM_TILED", "full")  # forced over its full range, as elsewhere
            tiled_cpu.row_limits.cache_clear()
        assert takes(lo, narrow) and takes(tiled_cpu.MAX_ROWS, narrow) and not takes(tiled_cpu.MAX_ROWS + 1, narrow)
        assert takes(2048, wide)  # a wide layer keeps the kernel at prefill's row counts
    finally:
        tiled_cpu.row_limits.cache_clear()


@needs_kernel
@pytest.mark.parametrize("vendor", ["amd", "intel"])
def test_where_the_kernel_outruns_mkl_it_takes_every_row_count(vendor, monkeypatch):
    """A Zen 5 (full-width 512-bit FMAs): the kernel measured 1.8-2.6x MKL at 32-2,048 rows, so it takes
    every count from MIN_ROWS on every layer, on any vendor where the start-up check says so."""
    monkeypatch.setattr(tiled_cpu, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(tiled_cpu, "outruns_mkl", lambda: True)
    tiled_cpu.row_limits.cache_clear()
    try:
        narrow, wide = torch.randn(64, 64), torch.randn(tiled_cpu.WIDE * 64, 64)
        for weight in (narrow, wide):
            assert not tiled_cpu.applies(tiled_cpu.MIN_ROWS - 1, torch.randn(1, 64), weight)
            assert all(tiled_cpu.applies(rows, torch.randn(rows, 64), weight)
                       for rows in (tiled_cpu.MIN_ROWS, tiled_cpu.MAX_ROWS + 1, 2048))
    finally:
        tiled_cpu.row_limits.cache_clear()


@needs_kernel
def test_the_start_up_check_measures_unless_the_setting_decides(monkeypatch):
    for setting, expected in (("all", True), ("full", False), ("mkl", False)):
        monkeypatch.setenv("MINILLM_TILED", setting)
        tiled_cpu.outruns_mkl.cache_clear()
        assert tiled_cpu.outruns_mkl() is expected
    monkeypatch.delenv("MINILLM_TILED")
    calls = []
    real = tiled_cpu.linear
    monkeypatch.setattr(tiled_cpu, "linear", lambda *a: calls.append(a[0].shape) or real(*a))
    tiled_cpu.outruns_mkl.cache_clear()
    try:
        assert isinstance(tiled_cpu.outruns_mkl(), bool)
        assert calls and calls[0] == torch.Size(tiled_cpu.CHECK_SHAPE[:2])  # it timed the kernel
    finally:
        tiled_cpu.outruns_mkl.cache_clear()
        tiled_cpu.row_limits.cache_clear()


@needs_kernel
@pytest.mark.parametrize("column_major_out", [False, True])
def test_skinny_linear_runs_the_tiled_kernel_between_the_few_row_kernel_and_mkl(column_major_out):
    torch.manual_seed(0)
    lin = nn.Linear(96, 200)
    ref = nn.Linear(96, 200)
    ref.load_state_dict(lin.state_dict())
    use_skinny_linears(lin)
    assert type(lin) is SkinnyLinear
    lin.column_major_out = column_major_out
    x = torch.randn(64, 96)
    with torch.no_grad():
        y = lin(x)
        expected = tiled_cpu.linear(x, lin.weight, lin.bias, row_major_out=not column_major_out)
        assert torch.equal(y, expected.t() if column_major_out else expected)
        assert y.stride() == ((1, 64) if column_major_out else (200, 1))
        torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)
    # with autograd recording (training heads on a frozen base) the kernel has no backward: MKL runs, grads flow
    xg = x.clone().requires_grad_()
    lin(xg).sum().backward()
    torch.testing.assert_close(xg.grad, lin.weight.sum(0).expand(64, 96), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_tiled_kernel_is_built_for_avx2_and_portable_too(tmp_path):
    """Both other instruction sets compile and give the float64 reference's values (run in a child process:
    a process loads one build of an op library)."""
    import os
    import platform
    import subprocess
    import sys

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("ATEN_CPU_CAPABILITY selects x86 instruction sets")

    code = (
        "import torch\n"
        "from minillm.cpu.kernels import tiled_cpu\n"
        "assert tiled_cpu.available()\n"
        "assert tiled_cpu.loaded_isa() == 'EXPECTED', tiled_cpu.loaded_isa()\n"
        "torch.manual_seed(0)\n"
        "x, w, b = torch.randn(70, 300), torch.randn(50, 300), torch.randn(50)\n"
        "ref = x.double() @ w.double().t() + b.double()\n"
        "for rm in (True, False):\n"
        "    y = tiled_cpu.linear(x, w, b, row_major_out=rm)\n"
        "    torch.testing.assert_close((y if rm else y.t()).double(), ref, rtol=1e-5, atol=2e-3)\n"
        "print('ok')\n"
    )
    for capability in ("avx2", "default"):
        code_here = code.replace("EXPECTED", "avx2" if capability == "avx2" else "portable")
        env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
        done = subprocess.run([sys.executable, "-c", code_here], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (capability, done.stderr[-2000:])


@pytest.mark.parametrize("fused_kernels", [False, True])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("route", ["bf16", "blocks"])
def test_a_quantized_down_projection_reads_the_column_major_activation(bits, route, fused_kernels, monkeypatch):
    """SwiGLU's gate/up may hand on a column-major view (column_major_out), and so may its activation (the
    fused C++ silu_mul keeps the layout); a quantized down projection behind it (a GGUF file's int4 layer,
    torch's int4/int8 CPU kernels) must take it as it is."""
    from minillm.cpu import layers as cpu_layers
    from minillm.cpu.kernels import fused_cpu
    from minillm.models.layers import SwiGLU
    from minillm.quant.linear import QuantLinear

    if fused_kernels and not fused_cpu.available():
        pytest.skip("the fused CPU kernels could not be built here")

    torch.manual_seed(bits)
    mlp = SwiGLU(64, 192)
    if fused_kernels:
        cpu_layers.swap_layers(mlp)
    use_skinny_linears(mlp)
    down = QuantLinear.from_float(mlp.down_proj.weight.detach(), bits, 32)
    if not down.use_cpu_kernels(route=route):
        pytest.skip(f"the {route} route does not take this shape here")
    mlp.down_proj = down
    x = torch.randn(256, 64)  # prefill's rows: the tiled kernel's wide-layer case where it is built
    with torch.no_grad():
        hidden = mlp.gate_up_proj(x)
        if fused_kernels and cpu_layers.applies(hidden):
            act = fused_cpu.silu_mul(hidden)
        else:
            gate, up = hidden.chunk(2, dim=-1)
            act = mlp.act(gate) * up
        assert (fused_kernels and cpu_layers.applies(hidden)) == fused_kernels
        got = mlp(x)
        want = down(act.contiguous())
    torch.testing.assert_close(got, want, rtol=0, atol=0)
