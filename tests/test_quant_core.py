"""Weight-only quantization on random tensors and tiny models: round trips, QuantLinear, layouts, errors."""
from __future__ import annotations

import pytest
import torch

from minillm.quant import (QuantLinear, dequantize_int4, pack_int4, quantize_int4, quantize_int8, quantize_model,
                           quantized_layers, unpack_int4)
from minillm.quant.awq import search_scale
from minillm.quant.methods import check_llm_options
from tests.helpers.engine_utils import tiny_model


def _w(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05


def test_int8_round_trip_error_is_at_most_half_a_step_per_row():
    w = _w(48, 80)
    q = quantize_int8(w)
    assert q.qweight.dtype == torch.int8 and q.qweight.abs().max() <= 127
    err = (q.dequantize() - w).abs()
    assert (err <= q.scales[:, None] / 2 + 1e-7).all()
    assert (q.qweight.abs().amax(1) == 127).all()  # every row uses its full range


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_round_trip_error_is_at_most_half_a_step_per_group(group):
    w = _w(40, 256)
    q = quantize_int4(w, group)
    assert q.qweight.shape == (40, 128) and q.qweight.dtype == torch.uint8
    scale = q.scale_zeros[..., 0].t().repeat_interleave(group, 1)  # [N, K]
    err = (q.dequantize() - w).abs()
    assert (err <= scale / 2 + 1e-6).all()
    # and the group's min and max are reproduced (both end codes are used)
    wg, dg = w.view(40, -1, group), q.dequantize().view(40, -1, group)
    torch.testing.assert_close(dg.amin(-1), wg.amin(-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(dg.amax(-1), wg.amax(-1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("n,k", [(1, 1), (3, 5), (7, 33), (13, 64)])
def test_int4_packing_on_odd_shapes(n, k):
    codes = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(n * k))
    packed = pack_int4(codes)
    assert packed.shape == (n, (k + 1) // 2) and packed.dtype == torch.uint8
    assert torch.equal(packed[:, 0] & 0xF, codes[:, 0].to(torch.uint8))  # even k: low nibble
    if k > 1:
        assert torch.equal(packed[:, 0] >> 4, codes[:, 1].to(torch.uint8))
    assert torch.equal(unpack_int4(packed, k), codes.to(torch.uint8))


def test_dequantize_int4_matches_the_formula():
    codes = torch.randint(0, 16, (4, 64), generator=torch.Generator().manual_seed(1))
    sz = torch.rand(2, 4, 2)
    w = dequantize_int4(pack_int4(codes), sz, 32, 64)
    g = torch.arange(64) // 32
    want = (codes.float() - 8) * sz[g, :, 0].t() + sz[g, :, 1].t()
    torch.testing.assert_close(w, want)


@pytest.mark.parametrize("bits,group", [(8, None), (4, 32), (4, 64)])
@pytest.mark.parametrize("cpu_kernels", [False, True])
def test_quant_linear_matches_float_linear_within_the_quantization_error(bits, group, cpu_kernels):
    w, x = _w(96, 192), torch.randn(5, 192, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(96) * 0.1
    q = QuantLinear.from_float(w, bits, group, bias=bias)
    if cpu_kernels:
        assert q.use_cpu_kernels() and q.layout == "cpu"
    y = q(x)
    # against the dequantized weight: only the kernel's arithmetic differs (bf16 activations on the CPU path)
    ref = x @ q.dequantize().t() + bias
    tol = 3e-2 if cpu_kernels else 1e-5
    torch.testing.assert_close(y, ref, atol=tol * ref.abs().max().item(), rtol=0)
    # against the float weight: the quantization error, relative
    rel = (y - (x @ w.t() + bias)).norm() / (x @ w.t()).norm()
    assert rel < (0.02 if bits == 8 else 0.15), rel
    assert y.shape == (5, 96) and q(x.view(1, 5, 192)).shape == (1, 5, 96)


@pytest.mark.slow
def test_compiled_batch1_int8_gemv_is_the_fp32_product_of_the_dequantized_weight():
    """Under torch.compile a one-row int8 matmul is a fused dequantize-and-reduce in fp32
    activations (the LM head's batch-1 decode path): it must equal x @ dequantize(W).T up to
    fp32 summation order -- far tighter than the bf16-activation kernel's 3e-2."""
    q = QuantLinear.from_float(_w(320, 192), 8)
    assert q.use_cpu_kernels()
    compiled = torch.compile(q, dynamic=True)
    for rows in (1, 3):  # 3 rows: the aten kernel again, inside the compiled graph
        x = torch.randn(rows, 192, generator=torch.Generator().manual_seed(rows))
        ref = x @ q.dequantize().t()
        tol = 1e-5 if rows == 1 else 3e-2
        torch.testing.assert_close(compiled(x), ref, atol=tol * ref.abs().max().item(), rtol=0)


def test_cpu_layout_dequantize_agrees_with_the_plain_layout():
    q = QuantLinear.from_float(_w(32, 128), 4, 32)
    plain = q.dequantize()
    assert q.use_cpu_kernels()
    # the CPU kernel keeps scales and zeros in bf16: equal up to that rounding
    torch.testing.assert_close(q.dequantize(), plain, atol=2e-3, rtol=1e-2)


def test_quantized_storage_is_smaller():
    w = _w(256, 512)
    f = w.numel() * 4
    q8, q4 = QuantLinear.from_float(w, 8), QuantLinear.from_float(w, 4, 64)
    assert q8.weight_bytes() == 256 * 512 + 256 * 4
    assert q4.weight_bytes() == 256 * 256 + (512 // 64) * 256 * 2 * 4
    assert q4.weight_bytes() < q8.weight_bytes() < f / 3


def test_awq_search_never_does_worse_than_rtn_and_wins_on_outlier_channels():
    w = _w(64, 128, seed=3)
    x = torch.randn(256, 128, generator=torch.Generator().manual_seed(4))
    x[:, :4] *= 30.0  # a few input channels with large activations, as in real LLMs
    r = search_scale(w, x, 32)
    assert r.error <= r.rtn_error
    assert r.alpha > 0 and r.error < 0.8 * r.rtn_error
    assert r.scale[:4].min() > r.scale[4:].max()  # the loud channels get the finer steps


@pytest.mark.parametrize("method", ["int8", "int4", "int4-awq"])
def test_quantized_tiny_model_stays_close_to_float(method):
    from minillm.eval import score_windows

    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(5))
    logits: dict[str, list[torch.Tensor]] = {"ref": [], "q": []}
    model = tiny_model(layers=2, heads=4, kv_heads=2, head_dim=16)  # hidden 64, mlp 96: group 32
    ref = score_windows(model, ids, chunk_size=8, block_size=4, on_logits=logits["ref"].append)
    q = tiny_model(layers=2, heads=4, kv_heads=2, head_dim=16)
    quantize_model(q, method, calibration=ids if method == "int4-awq" else None)
    assert len(quantized_layers(q)) == 8
    got = score_windows(q, ids, chunk_size=8, block_size=4, on_logits=logits["q"].append)
    a, b = torch.cat(logits["ref"], 1), torch.cat(logits["q"], 1)
    rel = ((b - a).norm() / a.norm()).item()
    agree = (got.top1 == ref.top1).float().mean().item()
    # a random model's logits are flat (many near-ties): int4's bound is loose on purpose
    assert rel < (0.03 if method == "int8" else 0.3), rel  # includes the CPU kernels' bf16 activations
    assert agree >= (0.95 if method == "int8" else 0.5), agree
    assert abs(got.perplexity / ref.perplexity - 1) < (0.005 if method == "int8" else 0.05)


def test_bad_input_gets_clear_errors():
    with pytest.raises(ValueError, match="does not divide in_features=80"):
        quantize_int4(_w(4, 80), 64)
    with pytest.raises(ValueError, match="group size must be one of"):
        quantize_int4(_w(4, 96), 48)
    with pytest.raises(ValueError, match="2-D float"):
        quantize_int8(torch.ones(4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="4 or 8 bits"):
        QuantLinear.from_float(_w(4, 32), 3)
    with pytest.raises(ValueError, match="unsupported quantization 'int3'"):
        check_llm_options("int3", None)
    with pytest.raises(ValueError, match="applies to int4, int4-awq, gptq only"):
        check_llm_options("int8", 64)
    with pytest.raises(ValueError, match="group size must be one of"):
        check_llm_options("int4", 100)
    with pytest.raises(ValueError, match="calibration"):
        quantize_model(tiny_model(), "int4-awq")
    model = tiny_model(head_dim=24)  # hidden 96: 64 does not divide it
    with pytest.raises(ValueError, match="does not divide"):
        quantize_model(model, "int4", group_size=64)
    quantize_model(model, "int8")
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(model, "int8")


def test_default_group_size_is_32_and_is_checked_against_the_model():
    from minillm.quant.apply import resolve_group_size

    assert resolve_group_size(tiny_model(), None) == 32  # hidden 64, mlp 96
    with pytest.raises(ValueError, match="does not divide"):
        resolve_group_size(tiny_model(head_dim=10), None)  # hidden 40


def test_int8_lm_head_keeps_the_float_embedding_and_counts_its_own_bytes():
    from minillm.eval import score_windows
    from minillm.quant.apply import quantize_lm_head
    from minillm.quant.footprint import model_bytes, weight_bytes_per_token

    model = tiny_model()
    ids = torch.randint(0, 97, (1, 16), generator=torch.Generator().manual_seed(6))
    ref = score_windows(model, ids, chunk_size=8, block_size=4)
    before = weight_bytes_per_token(model)
    head = quantize_lm_head(model)
    assert isinstance(model.lm_head, QuantLinear) and model.embed_tokens.weight.dtype == torch.float32
    table = 97 * 64
    # per token: the int8 head (codes + bf16 row scales) is read instead of the float table
    assert weight_bytes_per_token(model) == before - table * 4 + head.weight_bytes() == before - table * 4 + table + 97 * 2
    assert model_bytes(model) == before + head.weight_bytes()  # the float table stays for the gather
    got = score_windows(model, ids, chunk_size=8, block_size=4)  # the runner's K-major re-layout leaves the head alone
    assert not hasattr(model.lm_head, "weight") and (got.top1 == ref.top1).float().mean() >= 0.9
    with pytest.raises(ValueError, match="already quantized"):
        quantize_lm_head(model)


def test_llm_refuses_bad_quantization_options_before_loading_the_model():
    from minillm import LLM

    with pytest.raises(ValueError, match="unsupported quantization 'int3'"):
        LLM(quantization="int3")
    with pytest.raises(ValueError, match="group size must be one of"):
        LLM(quantization="int4", quantization_group_size=48)
    with pytest.raises(ValueError, match="without quantization"):
        LLM(quantization_group_size=32)
    with pytest.raises(ValueError, match="needs a .gguf model"):
        from minillm.quant.apply import quantize_loaded
        from types import SimpleNamespace

        quantize_loaded(SimpleNamespace(source="/some/folder", model=None), "gguf")


def test_cuda_path_without_triton_is_an_error_unless_the_fallback_is_asked_for(monkeypatch):
    """On CUDA a missing Triton kernel must not silently dequantize the whole weight on every call."""
    import warnings

    from minillm.quant import linear

    monkeypatch.setattr(linear, "_triton_error", lambda: "ImportError: no triton")
    monkeypatch.delenv(linear.DEQUANT_FALLBACK_ENV, raising=False)
    with pytest.raises(RuntimeError, match="MINILLM_QUANT_DEQUANT_FALLBACK=1"):
        linear.cuda_matmul_path()
    monkeypatch.setenv(linear.DEQUANT_FALLBACK_ENV, "1")
    monkeypatch.setattr(linear, "_warned_fallback", False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert linear.cuda_matmul_path() == "dequantize"
        assert linear.cuda_matmul_path() == "dequantize"
    assert len([w for w in seen if "dequantize their whole weight" in str(w.message)]) == 1  # said once
    monkeypatch.setattr(linear, "_triton_error", lambda: None)
    assert linear.cuda_matmul_path() == "triton"
