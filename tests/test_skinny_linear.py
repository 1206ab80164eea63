"""SkinnyLinear (models/skinny_linear.py): the same products as nn.Linear, through W @ x.T for few rows."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from minillm.models.skinny_linear import MAX_ROWS, SkinnyLinear, use_skinny_linears


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
