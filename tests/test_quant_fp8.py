"""fp8 (e4m3) weights per output channel: round trip within e4m3's bound, the CPU dequantize path, the
torch._scaled_mm path (CUDA's, run here on CPU's _scaled_mm), the tiny and the default model."""
from __future__ import annotations

import pytest
import torch

from minillm.quant import quantize_model
from minillm.quant.fp8 import E4M3, FP8Linear, e4m3_table, fp8_scaled_matmul, quantize_fp8, scaled_mm_path
from tests.helpers.engine_utils import tiny_model


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_fp8_round_trip_is_within_e4m3s_bound():
    w = torch.randn(64, 200, generator=_gen(0)) * 0.05
    w[3] *= 40.0  # rows of very different ranges: each has its own scale
    q, s = quantize_fp8(w)
    assert q.dtype == E4M3
    back = q.float() * s[:, None]
    err = (back - w).abs()
    # 3 mantissa bits: half a step is 2^-4 of the value for normals; subnormals (below 2^-6 s) step 2^-9 s
    bound = torch.maximum(w.abs() * 2.0 ** -4, s[:, None] * 2.0 ** -10)
    assert (err <= bound * (1 + 1e-6)).all()
    torch.testing.assert_close(back.abs().amax(1), w.abs().amax(1))
    assert (q.float().abs().amax(1) == 448.0).all()  # each row's max maps onto e4m3's largest value
    # and it is a real rounding: almost every weight moved
    assert (err > 0).float().mean() > 0.9


def test_the_lookup_table_holds_every_e4m3_value():
    table = e4m3_table()
    codes = torch.arange(256, dtype=torch.uint8).view(E4M3)
    finite = ~torch.isnan(codes.float())
    assert finite.sum() == 254
    assert torch.equal(table[finite], codes.float()[finite])


@pytest.mark.parametrize("m", [1, 7])
def test_fp8_linear_on_cpu_is_the_float_product_of_the_dequantized_weight(m):
    w = torch.randn(48, 64, generator=_gen(1)) * 0.05
    bias = torch.randn(48, generator=_gen(2))
    lin = FP8Linear.from_float(w, bias)
    assert not scaled_mm_path(torch.device("cpu"))
    x = torch.randn(m, 64, generator=_gen(3))
    ref = x.double() @ (lin.qweight.float().double() * lin.scales.double()[:, None]).t() + bias.double()
    y = lin(x)
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-5
    assert lin(x.view(1, m, 64)).shape == (1, m, 48) and lin(x.bfloat16()).dtype == torch.bfloat16
    assert lin.weight_bytes() == 48 * 64 + 48 * 4 + 48 * 4  # 1 byte per weight, a float scale and bias per row


def test_the_scaled_mm_path_matches_fp8_fake_quantization():
    """CUDA's path (per-token e4m3 activations, row-wise scales, bf16 out), run on CPU's torch._scaled_mm."""
    w = torch.randn(48, 64, generator=_gen(4)) * 0.05
    x = torch.randn(9, 64, generator=_gen(5))
    x[:, 2] *= 30.0
    q, s = quantize_fp8(w)
    y = fp8_scaled_matmul(x, q, s)
    assert y.dtype == torch.bfloat16 and y.shape == (9, 48)
    xs = x.abs().amax(1, keepdim=True) / 448.0
    xd = (x / xs).to(E4M3).double() * xs.double()
    ref = xd @ (q.double() * s.double()[:, None]).t()
    rel = ((y.double() - ref).norm() / ref.norm()).item()
    assert rel < 5e-3, rel  # bf16 output rounding (2^-9 relative); measured 1.7e-3
    with pytest.raises(ValueError, match="multiples of 16"):
        FP8Linear(100, 64, device="cuda")  # refused before any CUDA allocation


def test_fp8_tiny_model_stays_close_to_float():
    from minillm.eval import score_windows

    ids = torch.randint(0, 97, (2, 24), generator=_gen(5))
    ref = score_windows(tiny_model(), ids, chunk_size=8, block_size=4)
    q = tiny_model()
    quantize_model(q, "fp8")
    assert sum(isinstance(m, FP8Linear) for m in q.modules()) == 8
    got = score_windows(q, ids, chunk_size=8, block_size=4)
    # measured: agreement 0.89 (a random model's flat logits have many near-ties), perplexity -0.04%
    assert (got.top1 == ref.top1).float().mean() >= 0.85
    assert abs(got.perplexity / ref.perplexity - 1) < 0.01
    with pytest.raises(ValueError, match="group_size applies to int4 methods only"):
        quantize_model(tiny_model(), "fp8", group_size=32)


@pytest.mark.slow
def test_fp8_on_the_default_model_agrees_with_float():
    from minillm.eval import corpus_tokens, score_windows, windows
    from minillm.loader import load_model

    loaded = load_model(dtype=torch.float32)
    held_out = windows(corpus_tokens(loaded.tokenizer, "eval", 2 * 256), 256, 2)
    ref = score_windows(loaded.model, held_out, chunk_size=64)
    quantize_model(loaded.model, "fp8")
    got = score_windows(loaded.model, held_out, chunk_size=64)
    agree = (got.top1 == ref.top1).double().mean().item()
    change = got.perplexity / ref.perplexity - 1
    print(f"fp8 on the default model: top-1 agreement {agree:.4f}, perplexity {change:+.2%}")
    # measured: agreement 0.916, perplexity +2.8% (e4m3's 3 mantissa bits; int8 per channel stays < 1%)
    assert agree >= 0.88 and change < 0.05, (agree, change)
