"""The torch backend's batched decode: head-major gather and matmul attention vs a plain reference."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minillm.attention.torch_backend import decode_gather_slots, decode_head_rows, paged_decode


def _pool(dtype: torch.dtype, batch: int = 5, kvh: int = 2, d: int = 16, bs: int = 4, max_blocks: int = 6):
    g = torch.Generator().manual_seed(0)
    num_blocks = batch * max_blocks + 3
    k = torch.randn(num_blocks, bs, kvh, d, generator=g).to(dtype)
    v = torch.randn(num_blocks, bs, kvh, d, generator=g).to(dtype)
    tables = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].view(batch, max_blocks).int()
    lens = torch.tensor([1, 7, bs * max_blocks, 13, 4][:batch], dtype=torch.int32)
    return k, v, tables, lens


def _reference(q, k, v, tables, lens, scale):
    """Each sequence alone: its keys token by token through the block table, SDPA in float64."""
    bs, kvh = k.shape[1], k.shape[2]
    out = []
    for i in range(q.shape[0]):
        pos = torch.arange(int(lens[i]))
        slots = tables[i, pos // bs].long() * bs + pos % bs
        ki = k.view(-1, kvh, k.shape[3])[slots].double().transpose(0, 1)[None]
        vi = v.view(-1, kvh, v.shape[3])[slots].double().transpose(0, 1)[None]
        qi = q[i].double()[None, :, None]
        out.append(F.scaled_dot_product_attention(qi, ki, vi, scale=scale, enable_gqa=True)[0, :, 0])
    return torch.stack(out)


def test_head_rows_gather_equals_per_token_gather_transposed():
    k, _, tables, lens = _pool(torch.float32)
    b, kvh, d, bs = tables.shape[0], k.shape[2], k.shape[3], k.shape[1]
    max_len = int(lens.max())
    slots, _ = decode_gather_slots(tables, lens, max_len, bs, masked=True)
    per_token = k.view(-1, kvh, d)[slots].view(b, max_len, kvh, d).transpose(1, 2)
    head_major = k.view(-1, d)[decode_head_rows(slots, b, kvh)].view(b, kvh, max_len, d)
    assert head_major.is_contiguous()
    torch.testing.assert_close(head_major, per_token, rtol=0, atol=0)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("ragged", [True, False])
def test_paged_decode_matches_reference(dtype, tol, ragged):
    k, v, tables, lens = _pool(dtype)
    if not ragged:
        lens = torch.full_like(lens, 9)
    b, heads, kvh, d, bs = tables.shape[0], 6, k.shape[2], k.shape[3], k.shape[1]
    q = torch.randn(b, heads, d, generator=torch.Generator().manual_seed(1)).to(dtype)
    max_len = int(lens.max())
    slots, mask = decode_gather_slots(tables, lens, max_len, bs, masked=ragged)
    out = paged_decode(q, k, v, decode_head_rows(slots, b, kvh), mask, d**-0.5)
    assert out.shape == (b, heads, d) and out.dtype == dtype
    ref = _reference(q, k, v, tables, lens, d**-0.5)
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
