"""SkinnyLinear (minillm/cpu/skinny_linear.py): the same products as nn.Linear, through W @ x.T for few rows."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from minillm.cpu.skinny_linear import MAX_ROWS, SkinnyLinear, use_skinny_linears


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 11, 64, MAX_ROWS, MAX_ROWS + 1])
@pytest.mark.parametrize("bias", [False, True])
def test_skinny_linear_equals_nn_linear(rows, bias):
    torch.manual_seed(rows)
    ref = nn.Linear(96, 200, bias=bias)
    skinny = nn.Linear(96, 200, bias=bias)
    skinny.load_state_dict(ref.state_dict())
    assert use_skinny_linears(skinny) == 1 and type(skinny) is SkinnyLinear
    x = torch.randn(rows, 96)
    torch.testing.assert_close(skinny(x), ref(x), rtol=1e-5, atol=1e-5)
    x3 = torch.randn(2, rows, 96)  # leading dims are kept
    assert skinny(x3).shape == (2, rows, 200)


def test_other_dtypes_and_layouts_use_the_plain_path():
    lin = nn.Linear(32, 16)
    use_skinny_linears(lin)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    assert torch.equal(lin.to(torch.bfloat16)(x), nn.functional.linear(x, lin.weight, lin.bias))
    lin = lin.float()
    lin.weight = nn.Parameter(lin.weight.detach().t().contiguous().t())  # K-major storage
    x = torch.randn(3, 32)
    assert torch.equal(lin(x), nn.functional.linear(x, lin.weight, lin.bias))
    assert lin(torch.randn(0, 32)).shape == (0, 16)


@pytest.mark.parametrize("rows", [*range(1, 9), 12, 16, 21, 32])  # beyond 8: groups of 8 over each weight tile
@pytest.mark.parametrize("in_out", [(576, 960), (1536, 576), (40, 13), (72, 5)])  # 13 rows: a tile and a remainder; K 40 and 72: the one-row stream's 64-float steps and an 8-float tail
def test_few_row_kernel_equals_float64_reference(rows, in_out):
    """The C++ kernel (minillm/cpu/kernels/skinny_f32.cpp), vector and portable paths, against float64."""
    from minillm.cpu.kernels import skinny_cpu

    if not skinny_cpu.available():
        pytest.skip("the few-row kernel could not be built here (no compiler)")
    k, n = in_out
    torch.manual_seed(rows * n)
    x, w, b = torch.randn(rows, k), torch.randn(n, k), torch.randn(n)
    ref = x.double() @ w.double().t() + b.double()
    for portable in (False, True):
        got = skinny_cpu.linear(x, w, b, portable)
        assert got.shape == (rows, n) and got.dtype == torch.float32
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-4 * k ** 0.5)
    torch.testing.assert_close(skinny_cpu.linear(x, w), (x.double() @ w.double().t()).float(), rtol=1e-5,
                               atol=1e-4 * k ** 0.5)


def test_few_row_kernel_is_what_skinny_linear_runs_and_refuses_what_it_cannot_do():
    from minillm.cpu.kernels import skinny_cpu

    if not skinny_cpu.available():
        pytest.skip("the few-row kernel could not be built here (no compiler)")
    lin = nn.Linear(64, 48)
    use_skinny_linears(lin)
    x = torch.randn(4, 64)
    with torch.no_grad():  # as the engine runs (a forward that records a graph takes F.linear)
        assert torch.equal(lin(x), skinny_cpu.linear(x, lin.weight, lin.bias))
    assert not skinny_cpu.applies(33, torch.randn(33, 64), lin.weight)  # beyond 32 rows: MKL's W @ x.T
    assert not skinny_cpu.applies(2, torch.randn(2, 64, dtype=torch.bfloat16), lin.weight.bfloat16())
    with pytest.raises(RuntimeError, match="1 to 32 rows"):
        skinny_cpu.linear(torch.randn(33, 64), lin.weight)
    with pytest.raises(RuntimeError, match="weight"):
        skinny_cpu.linear(torch.randn(2, 64), torch.randn(48, 65))


def test_a_kernel_that_cannot_build_warns_and_falls_back():
    from minillm.cpu.kernels import gguf_cpu

    def broken():
        raise gguf_cpu.GGUFKernelUnavailable("no compiler")

    with pytest.warns(UserWarning, match="MKL runs instead: no compiler"):
        assert gguf_cpu.loads_or_warns(broken, "MKL runs instead") is False
    assert gguf_cpu.loads_or_warns(lambda: None, "unused") is True


@pytest.fixture
def transposed_product(monkeypatch):
    """W @ x.T up to MAX_ROWS, as on a CPU other than Intel's (on Intel's, F.linear from 33 rows)."""
    from minillm.cpu import skinny_linear

    monkeypatch.setattr(skinny_linear, "transposed_max_rows", lambda: MAX_ROWS)


@pytest.mark.parametrize("vendor", ["intel", "amd"])
def test_beyond_the_kernels_an_intel_cpu_takes_mkls_own_product(vendor, monkeypatch):
    from minillm.cpu.kernels import tiled_cpu
    from minillm.cpu import skinny_linear

    monkeypatch.setattr(tiled_cpu, "_ready", False)  # the path beyond both kernels
    monkeypatch.setattr(tiled_cpu, "cpu_vendor", lambda: vendor)
    monkeypatch.delenv("MINILLM_TILED", raising=False)
    skinny_linear.transposed_max_rows.cache_clear()
    try:
        assert skinny_linear.transposed_max_rows() == (32 if vendor == "intel" else MAX_ROWS)
        lin = nn.Linear(96, 200)
        use_skinny_linears(lin)
        lin.column_major_out = True
        x = torch.randn(100, 96)
        with torch.no_grad():
            y = lin(x)
        # Intel: F.linear's own product and layout; elsewhere W @ x.T's transpose as a view
        assert y.is_contiguous() == (vendor == "intel")
        torch.testing.assert_close(y, nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    finally:
        skinny_linear.transposed_max_rows.cache_clear()


@pytest.mark.parametrize("rows", [33, 64, 128])
@pytest.mark.parametrize("bias", [False, True])
def test_column_major_out_is_the_same_product_as_a_column_major_view(rows, bias, transposed_product):
    """A layer read only elementwise gets W @ x.T's transpose as a view: same values as nn.Linear, strides
    (1, rows); an elementwise op keeps that layout, and `residual + x` (RMSNorm's order) is row-major again."""
    torch.manual_seed(rows)
    ref = nn.Linear(96, 200, bias=bias)
    lin = nn.Linear(96, 200, bias=bias)
    lin.load_state_dict(ref.state_dict())
    lin.column_major_out = True
    use_skinny_linears(lin)
    x = torch.randn(rows, 96)
    with torch.no_grad():  # as the engine runs; a forward that records a graph takes F.linear
        _check_column_major(lin, ref, x, rows)


def _check_column_major(lin, ref, x, rows):
    y = lin(x)
    torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)
    assert y.shape == (rows, 200) and y.stride() == (1, rows)
    assert torch.nn.functional.silu(y).stride() == (1, rows)
    residual = torch.randn(rows, 200)
    assert (residual + y).is_contiguous()
    assert lin(torch.randn(3, rows, 96)).shape == (3, rows, 200)
    lin.column_major_out = False
    assert lin(x).is_contiguous()


@pytest.mark.parametrize("rows", [33, 100])
def test_a_wide_layer_is_multiplied_in_blocks_of_output_rows(rows, monkeypatch, transposed_product):
    """Beyond OUT_BLOCK outputs (an LM head), the product runs block by block: exactly one W @ x.T.
    (Where the tiled kernel is built it takes these rows; this is the path where it is not.)"""
    from minillm.cpu.kernels import tiled_cpu
    from minillm.cpu.skinny_linear import OUT_BLOCK

    monkeypatch.setattr(tiled_cpu, "_ready", False)

    torch.manual_seed(rows)
    out = 2 * OUT_BLOCK + 77  # a last block shorter than the others
    lin = nn.Linear(64, out, bias=False)
    use_skinny_linears(lin)
    x = torch.randn(rows, 64)
    with torch.no_grad():  # as the engine runs (torch.mm with out= cannot record a graph)
        y = lin(x)
    assert y.is_contiguous() and y.shape == (rows, out)
    assert torch.equal(y, (lin.weight @ x.t()).t())
    torch.testing.assert_close(y, x @ lin.weight.t(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 4, 40])  # the few-row kernel's rows and the tiled kernel's
def test_a_forward_that_records_a_graph_backpropagates_exactly(rows):
    """Training Medusa/Hydra heads runs their outputs through the frozen LM head: the gradient to its input
    must be exact, with no kernel that autograd cannot differentiate (torch would warn and drop it)."""
    import warnings

    torch.manual_seed(rows)
    lin = nn.Linear(48, 80, bias=False)
    use_skinny_linears(lin)
    lin.weight.requires_grad_(False)  # frozen, as the LM head is
    x = torch.randn(rows, 48, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lin(x).pow(2).sum().backward()
    expected = 2 * (x.detach() @ lin.weight.t()) @ lin.weight
    torch.testing.assert_close(x.grad, expected, rtol=1e-5, atol=1e-5)


def test_the_greedy_kernel_picks_torchs_token_in_every_case():
    """minillm/cpu/kernels/skinny_f32.cpp's greedy: the first maximum of each row, a NaN counting as the maximum
    (its first one), as torch's max(-1).indices -- on ties, NaNs, infinities and rows of every length
    around the vector width and the threads' split."""
    from minillm.engine.sampler import greedy_tokens
    from minillm.cpu.kernels import skinny_cpu

    if not skinny_cpu.available():
        pytest.skip("the few-row kernel could not be built here")
    g = torch.Generator().manual_seed(0)
    for trial in range(600):
        rows, cols = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 700, (1,), generator=g))
        x = torch.randint(-3, 4, (rows, cols), generator=g).float()  # integers: many tied maxima
        if trial % 2:
            x = torch.randn(rows, cols, generator=g)
        if trial % 3 == 0:  # NaNs here and there
            for _ in range(int(torch.randint(0, 4, (1,), generator=g))):
                x[int(torch.randint(0, rows, (1,), generator=g)), int(torch.randint(0, cols, (1,), generator=g))] = float("nan")
        if trial % 7 == 0:
            x[:] = float("-inf")
        if trial % 11 == 0:
            x[:, -1] = float("inf")
        assert skinny_cpu.greedy_applies(x)
        assert torch.equal(skinny_cpu.greedy(x), x.max(-1).indices), (trial, x)
        assert torch.equal(greedy_tokens(x, keepdim=True), x.max(-1, keepdim=True).indices)
    x = torch.randn(2, 49152, generator=g)  # SmolLM2's vocabulary, split between the threads
    x[1, 30000] = x[1, 40000] = x[1].max() + 1
    assert skinny_cpu.greedy(x).tolist() == x.max(-1).indices.tolist() and skinny_cpu.greedy(x)[1] == 30000
    assert not skinny_cpu.greedy_applies(x.double()) and not skinny_cpu.greedy_applies(x[0])
