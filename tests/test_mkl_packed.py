"""MKL's packed sgemm for batched float32 linears (minillm/cpu/kernels/mkl_packed.py) against F.linear."""
from __future__ import annotations

import gc

import pytest
import torch
from torch.nn import functional as F

from minillm.cpu.kernels import mkl_packed, tiled_cpu
from minillm.cpu.skinny_linear import SkinnyLinear

if not mkl_packed.works_here():
    pytest.skip("this torch has no MKL packed sgemm, or its packing depends on the row count", allow_module_level=True)


@pytest.mark.parametrize("rows", [1, 33, 64, 128, 200, 700])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_product_equals_f_linear_at_any_row_count(rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(300, 96, generator=g)
    b = torch.randn(300, generator=g) if bias else None
    x = torch.randn(rows, 96, generator=g)
    torch.testing.assert_close(mkl_packed.linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_a_weight_changed_in_place_or_replaced_is_packed_again():
    lin = torch.nn.Linear(64, 80, bias=False)
    x = torch.randn(40, 64)
    with torch.no_grad():
        first = mkl_packed.linear(x, lin.weight)
        assert mkl_packed.packed_weight(lin.weight) is mkl_packed.packed_weight(lin.weight)  # kept
        lin.weight.mul_(2)  # in place: the version moves
        torch.testing.assert_close(mkl_packed.linear(x, lin.weight), 2 * first, rtol=1e-5, atol=1e-5)
        lin.weight.data = torch.randn(80, 64)  # new storage under the same parameter
        torch.testing.assert_close(mkl_packed.linear(x, lin.weight), F.linear(x, lin.weight), rtol=1e-5, atol=1e-5)


def test_the_packed_copy_goes_with_its_weight():
    w = torch.randn(48, 32)
    mkl_packed.linear(torch.randn(40, 32), w)
    key = id(w)
    assert key in mkl_packed._packed
    del w
    gc.collect()
    assert key not in mkl_packed._packed


def test_a_batched_skinny_linear_takes_the_packed_product_when_enabled(monkeypatch):
    """On an Intel CPU a batch above the few-row kernels' 32 rows multiplies the packed copy (here forced
    on, whatever the CPU, and the tiled kernel, which takes these rows on AMD, forced off); the result is
    F.linear's."""
    monkeypatch.setattr(mkl_packed, "enabled", lambda: True)
    monkeypatch.setattr(tiled_cpu, "applies", lambda *a: False)
    lin = SkinnyLinear(96, 120, bias=True)
    x = torch.randn(3, 20, 96)  # 60 rows
    calls = []
    real = mkl_packed.linear
    monkeypatch.setattr(mkl_packed, "linear", lambda *a: calls.append(a[0].shape) or real(*a))
    monkeypatch.setattr("minillm.cpu.skinny_linear.transposed_max_rows", lambda: 32)
    with torch.no_grad():
        y = lin(x)
    assert calls == [torch.Size([60, 96])]
    torch.testing.assert_close(y, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


def test_strided_inputs_give_f_linear_s_result():
    """A column-major view (what a column_major_out layer hands the next one) and a column slice."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(300, 96, generator=g)
    for x in (torch.randn(96, 70, generator=g).t(), torch.randn(70, 200, generator=g)[:, :96]):
        assert not x.is_contiguous()
        torch.testing.assert_close(mkl_packed.linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_the_copies_stay_within_the_budget(monkeypatch):
    """MINILLM_MKL_PACK_MB caps what the packed copies hold; past it a product runs unpacked (same result)."""
    monkeypatch.setenv("MINILLM_MKL_PACK_MB", str((mkl_packed.packed_bytes() + 300 * 96 * 4 + 1000) / 2**20))
    first, second = torch.randn(300, 96), torch.randn(300, 96)
    x = torch.randn(50, 96)
    assert mkl_packed.packed_weight(first) is not None
    assert mkl_packed.packed_weight(second) is None  # no room left
    torch.testing.assert_close(mkl_packed.linear(x, second), F.linear(x, second), rtol=1e-5, atol=1e-5)
    del first
    gc.collect()
    assert mkl_packed.packed_weight(second) is not None  # the first copy went with its weight


def test_prefill_sized_products_are_not_packed():
    x, w = torch.randn(mkl_packed.MAX_ROWS + 1, 16), torch.randn(24, 16)
    assert not mkl_packed.applies(x.shape[0], x, w)
