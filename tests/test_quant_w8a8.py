"""W8A8 (SmoothQuant): the int8 x int8 layer against a fake-quant float reference, smoothing exact in float,
what smoothing buys on outlier channels, the tiny and the default model."""
from __future__ import annotations

import pytest
import torch

from minillm.quant import quantize_model
from minillm.quant.smoothquant import activation_max, smooth_model, smoothing_factors
from minillm.quant.w8a8 import W8A8Linear, cuda_rows, int8_matmul, quantize_per_token
from tests.helpers.engine_utils import tiny_model


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _fake_quant_reference(x: torch.Tensor, w: torch.Tensor, bias, input_scale) -> torch.Tensor:
    """Quantize -> dequantize -> float64 matmul, written out here from the formulas (no minillm code)."""
    x, w = x.double(), w.double()
    if input_scale is not None:
        x = x * input_scale.double()
    xs = x.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127
    ws = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127
    xd = torch.round(x / xs).clamp(-127, 127) * xs
    wd = torch.round(w / ws).clamp(-127, 127) * ws
    y = xd @ wd.t()
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("m", [1, 5, 33])
@pytest.mark.parametrize("smoothed", [False, True])
def test_w8a8_linear_equals_the_fake_quant_reference(m, smoothed):
    w = torch.randn(40, 96, generator=_gen(0)) * 0.05
    x = torch.randn(m, 96, generator=_gen(1))
    x[:, 3] *= 20.0
    bias = torch.randn(40, generator=_gen(2)) * 0.1
    s = torch.rand(96, generator=_gen(3)) + 0.5 if smoothed else None
    lin = W8A8Linear.from_float(w, bias, s)
    y = lin(x)
    ref = _fake_quant_reference(x, w, bias, s)
    rel = ((y.double() - ref).norm() / ref.norm()).item()
    assert rel < 1e-4, rel  # int32 sums are exact: only the float rescale rounds
    assert y.shape == (m, 40) and lin(x.view(1, m, 96)).shape == (1, m, 40)
    assert lin(x.bfloat16()).dtype == torch.bfloat16


def test_int8_matmul_is_exact_and_per_token_quantization_is_within_half_a_step():
    a = torch.randint(-127, 128, (7, 50), generator=_gen(4), dtype=torch.int8)
    b = torch.randint(-127, 128, (13, 50), generator=_gen(5), dtype=torch.int8)
    got = int8_matmul(a, b)
    assert got.dtype == torch.int32 and torch.equal(got.long(), a.long() @ b.long().t())
    x = torch.randn(6, 64, generator=_gen(6))
    x[2] = 0.0  # an all-zero token
    q, scale = quantize_per_token(x)
    assert (q.float() * scale[:, None] - x).abs().le(scale[:, None] / 2 + 1e-7).all()
    assert (q[[0, 1, 3, 4, 5]].abs().amax(1) == 127).all() and (q[2] == 0).all()


def test_cuda_rows_meet_int_mm_shape_rules():
    """torch._int_mm on CUDA: more than 16 rows, a multiple of 8 (checked here, run on a GPU only)."""
    for m in (1, 16, 17, 24, 25, 300):
        r = cuda_rows(m)
        assert r >= m and r > 16 and r % 8 == 0 and r - max(m, 17) < 8
    with pytest.raises(ValueError, match="multiples of 8"):
        W8A8Linear(100, 64, device="cuda")  # refused before any CUDA allocation


def test_smoothing_factors_follow_the_formula():
    w = torch.randn(16, 8, generator=_gen(7))
    x_max = torch.rand(8, generator=_gen(8)) * 10
    x_max[5] = 0.0  # a channel that never fired
    for alpha in (0.0, 0.5, 0.8, 1.0):
        s = smoothing_factors(x_max, w, alpha)
        want = x_max ** alpha / w.abs().amax(0) ** (1 - alpha)
        torch.testing.assert_close(s[[0, 1, 2, 3, 4, 6, 7]], want[[0, 1, 2, 3, 4, 6, 7]])
        assert s[5] == 1.0
    with pytest.raises(ValueError, match="alpha must be in"):
        smoothing_factors(x_max, w, 1.5)


def test_smoothing_is_exact_in_float():
    """Folded into the norms, the `up` rows and o_proj's runtime scale: the float model computes the same."""
    from minillm.eval import score_windows

    ids = torch.randint(0, 97, (2, 24), generator=_gen(9))
    logits = {"ref": [], "smooth": []}
    model = tiny_model()
    score_windows(model, ids, chunk_size=8, block_size=4, on_logits=logits["ref"].append)
    norm_before = model.layers[0].input_layernorm.weight.clone()
    scales = smooth_model(model, activation_max(model, ids), alpha=0.5)
    assert not torch.allclose(model.layers[0].input_layernorm.weight, norm_before)  # it really moved
    for i, layer in enumerate(model.layers):  # o_proj: x / s at runtime (W8A8Linear.input_scale)
        inv = 1.0 / scales[f"layers.{i}.self_attn.o_proj"]
        layer.self_attn.o_proj.register_forward_pre_hook(lambda _m, args, inv=inv: (args[0] * inv,))
    score_windows(model, ids, chunk_size=8, block_size=4, on_logits=logits["smooth"].append)
    a, b = torch.cat(logits["ref"], 1), torch.cat(logits["smooth"], 1)
    assert ((b - a).norm() / a.norm()).item() < 1e-5


def test_smoothing_cuts_the_w8a8_error_on_outlier_channels():
    w = torch.randn(64, 128, generator=_gen(10)) * 0.05
    x = torch.randn(256, 128, generator=_gen(11))
    x[:, :4] *= 60.0  # channels loud in every token, as in LLM activations
    ref = x @ w.t()
    err = {}
    for alpha in (0.0, 0.5):
        s = smoothing_factors(x.abs().amax(0), w, alpha)
        y = W8A8Linear.from_float(w * s, None, 1.0 / s)(x)
        err[alpha] = ((y - ref).norm() / ref.norm()).item()
    assert err[0.5] < 0.5 * err[0.0], err


def test_w8a8_tiny_model_stays_close_to_float():
    from minillm.eval import score_windows

    ids = torch.randint(0, 97, (2, 24), generator=_gen(5))
    ref = score_windows(tiny_model(), ids, chunk_size=8, block_size=4)
    q = tiny_model()
    quantize_model(q, "w8a8", calibration=ids)
    layers = [m for m in q.modules() if isinstance(m, W8A8Linear)]
    assert len(layers) == 8 and sum(m.input_scale is not None for m in layers) == 2  # the o_projs
    got = score_windows(q, ids, chunk_size=8, block_size=4)
    assert (got.top1 == ref.top1).float().mean() >= 0.9
    assert abs(got.perplexity / ref.perplexity - 1) < 0.01
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(q, "int8")
    with pytest.raises(ValueError, match="w8a8 needs calibration"):
        quantize_model(tiny_model(), "w8a8")


@pytest.mark.slow
def test_w8a8_on_the_default_model_agrees_with_float():
    """Held-out pydoc text (eval split); SmoothQuant alpha 0.5 on 8 x 128 calib tokens."""
    from minillm.eval import corpus_tokens, score_windows, windows
    from minillm.loader import load_model

    loaded = load_model(dtype=torch.float32)
    held_out = windows(corpus_tokens(loaded.tokenizer, "eval", 2 * 256), 256, 2)
    ref = score_windows(loaded.model, held_out, chunk_size=64)
    quantize_model(loaded.model, "w8a8", calibration=windows(corpus_tokens(loaded.tokenizer, "calib", 1024), 128, 8))
    got = score_windows(loaded.model, held_out, chunk_size=64)
    agree = (got.top1 == ref.top1).double().mean().item()
    change = got.perplexity / ref.perplexity - 1
    print(f"w8a8 on the default model: top-1 agreement {agree:.4f}, perplexity {change:+.2%}")
    # measured: agreement 0.93, perplexity +1.1% (4 x 256 held-out tokens, 16 x 128 calibration)
    assert agree >= 0.9 and change < 0.03, (agree, change)


def test_w8a8_and_fp8_are_llm_options_without_a_group_size():
    from minillm.quant.methods import check_llm_options

    check_llm_options("w8a8", None)
    check_llm_options("fp8", None)
    for method in ("w8a8", "fp8"):
        with pytest.raises(ValueError, match="applies to int4, int4-awq, gptq only"):
            check_llm_options(method, 32)


@pytest.mark.parametrize("kernel", ["int_mm", "float32"])
def test_both_cpu_int8_gemms_give_the_exact_integer_sums(kernel, monkeypatch):
    """The CPU GEMM is chosen by int8 dot-product instructions; both choices must give the exact sums
    (K = 1040: the widest layer whose worst-case float32 partial sum, K * 127^2, stays below 2^24)."""
    from minillm.quant import w8a8

    monkeypatch.setenv(w8a8.INT8_GEMM_ENV, kernel)
    w8a8.int8_gemm_kernel.cache_clear()
    try:
        assert w8a8.int8_gemm_kernel() == kernel
        a = torch.full((3, 1040), 127, dtype=torch.int8)
        a[1] = torch.randint(-127, 128, (1040,), generator=_gen(8), dtype=torch.int8)
        b = torch.cat([torch.full((2, 1040), 127, dtype=torch.int8),
                       torch.randint(-127, 128, (9, 1040), generator=_gen(9), dtype=torch.int8)])
        want = a.long() @ b.long().t()
        got = w8a8.int8_matmul(a, b)
        assert got.dtype == torch.int32 and torch.equal(got.long(), want)
        assert torch.equal(w8a8.int8_matmul_float(a, b, kernel).double(), want.double())
        lin = W8A8Linear.from_float(torch.randn(24, 64, generator=_gen(10)))
        assert lin.cpu_kernel == kernel and f"cpu_gemm={kernel}" in repr(lin)
    finally:
        w8a8.int8_gemm_kernel.cache_clear()


def test_the_cpu_int8_gemm_follows_the_int8_dot_product_flags(monkeypatch):
    from minillm.quant import w8a8

    monkeypatch.delenv(w8a8.INT8_GEMM_ENV, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    for flags, want in (({"avx2", "fma"}, "float32"), ({"avx2", "avx_vnni"}, "int_mm"),
                        ({"avx512f", "avx512_vnni"}, "int_mm"), ({"amx_int8"}, "int_mm")):
        monkeypatch.setattr(w8a8, "cpu_flags", lambda f=flags: set(f))
        w8a8.int8_gemm_kernel.cache_clear()
        assert w8a8.int8_gemm_kernel() == want, flags
    monkeypatch.setenv(w8a8.INT8_GEMM_ENV, "int4")
    w8a8.int8_gemm_kernel.cache_clear()
    with pytest.raises(ValueError, match="MINILLM_INT8_GEMM"):
        w8a8.int8_gemm_kernel()
    w8a8.int8_gemm_kernel.cache_clear()
