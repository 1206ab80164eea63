"""The few-row linear on panel-packed weights (minillm/cpu/kernels/panel_f32.cpp, minillm/cpu/panels.py): the
layout, the kernel against a float64 reference, SkinnyLinear's use of it, and when an engine packs."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from minillm.cpu.panels import PANELS_ENV, body_linears, pack_panels, panels_wanted
from minillm.cpu.kernels import gguf_cpu, panel_cpu
from minillm.cpu.skinny_linear import PANEL_ROWS, SkinnyLinear, use_skinny_linears

try:
    panel_cpu.load()
    BUILT, WHY = True, ""
except gguf_cpu.GGUFKernelUnavailable as e:
    BUILT, WHY = False, str(e)
SIMD = BUILT and panel_cpu.available()
needs_build = pytest.mark.skipif(not BUILT, reason=f"panel kernel unavailable: {WHY}")
needs_simd = pytest.mark.skipif(not SIMD, reason="the panel kernel's AVX-512 path is not built on this CPU")


def test_pack_puts_32_outputs_of_each_input_side_by_side():
    w = torch.randn(70, 9)
    p = panel_cpu.pack(w)
    assert p.shape == (3, 9, 32)
    for n in (0, 31, 32, 69):
        assert torch.equal(p[n // 32, :, n % 32], w[n])
    assert torch.equal(p[2, :, 6:], torch.zeros(9, 26))  # the last panel's padding


@needs_build
@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 16])  # beyond 8: a second group of rows re-reads each panel
@pytest.mark.parametrize("out_in", [(960, 576), (576, 1536), (70, 40), (5, 3)])  # 70 and 5: a partial last panel
def test_panel_kernel_equals_float64_reference(portable, rows, out_in):
    torch.manual_seed(rows)
    n, k = out_in
    w, b, x = torch.randn(n, k), torch.randn(n), torch.randn(rows, k)
    ref = (x.double() @ w.double().t() + b.double()).float()
    tol = 1e-5 * k**0.5 * 4
    torch.testing.assert_close(panel_cpu.linear(x, panel_cpu.pack(w), b, n, portable), ref, rtol=1e-5, atol=tol)
    torch.testing.assert_close(panel_cpu.linear(x, panel_cpu.pack(w), None, n, portable), ref - b, rtol=1e-5, atol=tol)


@needs_build
def test_panel_kernel_rejects_what_it_cannot_read():
    w = panel_cpu.pack(torch.randn(70, 8))
    with pytest.raises(RuntimeError, match="rows of x"):
        panel_cpu.linear(torch.randn(17, 8), w, None, 70)
    with pytest.raises(RuntimeError, match="last panel"):
        panel_cpu.linear(torch.randn(2, 8), w, None, 100)
    with pytest.raises(RuntimeError, match="x \\[M, K\\]"):
        panel_cpu.linear(torch.randn(2, 9), w, None, 70)


def skinny(n: int = 100, k: int = 64, bias: bool = True) -> SkinnyLinear:
    lin = nn.Linear(k, n, bias=bias)
    use_skinny_linears(lin)
    return lin


@needs_simd
def test_a_skinny_linear_with_panels_reads_them_for_a_few_rows(monkeypatch):
    torch.manual_seed(0)
    lin = skinny()
    ref = {r: torch.randn(r, 64) for r in (1, 2, 4, 8, 9)}
    want = {r: nn.functional.linear(x, lin.weight, lin.bias) for r, x in ref.items()}
    lin.set_panels(panel_cpu.pack(lin.weight))
    calls = []
    real = panel_cpu.linear
    monkeypatch.setattr(panel_cpu, "linear", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    with torch.inference_mode():
        for r, x in ref.items():
            torch.testing.assert_close(lin(x), want[r], rtol=1e-5, atol=1e-4)
        assert lin(ref[4].reshape(2, 2, 64)).shape == (2, 2, 100)
    assert calls == [r for r in ref if r in PANEL_ROWS] + [4]  # 1-3 rows and 9 keep the row-major kernels
    assert 4 in PANEL_ROWS and 1 not in PANEL_ROWS
    with torch.no_grad():  # the weight written in place: the panels are stale and are dropped
        lin.weight.mul_(2.0)
    with torch.inference_mode():
        torch.testing.assert_close(lin(ref[4]), nn.functional.linear(ref[4], lin.weight, lin.bias), rtol=1e-5, atol=1e-4)
    assert lin.panels is None and len(calls) == len([r for r in ref if r in PANEL_ROWS]) + 1
    lin.set_panels(panel_cpu.pack(lin.weight))
    lin.weight = nn.Parameter(torch.randn(100, 64))  # replaced: stale too
    assert not lin.panels_current() and lin.panels is None


@needs_simd
def test_a_forward_that_records_a_graph_keeps_f_linear():
    lin = skinny()
    lin.set_panels(panel_cpu.pack(lin.weight))
    x = torch.randn(4, 64, requires_grad=True)
    lin(x).sum().backward()  # the panel op has no autograd formula
    assert x.grad is not None


class Config:
    def __init__(self, speculative=None, compile=False):
        self.speculative, self.compile = speculative, compile


def tiny():
    from tests.helpers.engine_utils import tiny_model

    model = tiny_model(heads=4, kv_heads=2, head_dim=16)
    use_skinny_linears(model)
    return model


def test_engines_pack_panels_for_speculative_decoding_only(monkeypatch):
    model = tiny()
    monkeypatch.delenv(PANELS_ENV, raising=False)
    assert "speculative" in panels_wanted(model, Config())
    assert "compiled" in panels_wanted(model, Config(speculative={"method": "ngram"}, compile=True))
    monkeypatch.setenv(PANELS_ENV, "0")
    assert panels_wanted(model, Config(speculative={"method": "ngram"})) == f"{PANELS_ENV}=0"
    monkeypatch.setenv(PANELS_ENV, "1")
    assert panels_wanted(model, Config()) == ("" if SIMD else "the panel kernel's AVX-512 path is not built here")
    assert "float32" in panels_wanted(tiny().to(torch.bfloat16), Config())


@needs_simd
def test_pack_panels_packs_each_body_linear_once():
    model = tiny()
    first = pack_panels(model)
    body = body_linears(model)
    assert first.layers == len(body) > 0 and first.already == 0
    assert first.nbytes == sum(-(-m.out_features // 32) * 32 * m.in_features * 4 for m in body)
    assert all(torch.equal(m.panels, panel_cpu.pack(m.weight)) for m in body)
    assert getattr(model.lm_head, "panels", None) is None  # the head (tied to the embedding) is not packed
    again = pack_panels(model)
    assert again.layers == 0 and again.already == len(body) and again.nbytes == first.nbytes


@needs_simd
def test_a_speculative_engine_with_panels_keeps_greedy_output(monkeypatch):
    """ngram lookup verifies k + 1 rows through the panels; its greedy tokens equal plain decoding's."""
    from minillm.engine.config import EngineConfig
    from minillm.engine.llm_engine import LLMEngine
    from tests.helpers.engine_utils import greedy, random_prompts, run_to_completion

    monkeypatch.delenv(PANELS_ENV, raising=False)
    model = tiny()
    prompts = [p * 3 for p in random_prompts(4, 97, 3, 8, seed=3)]  # repeats: lookup finds drafts

    def go(speculative):
        # the panel op is the subject: the one-region step (which reads the panels itself) stays off
        eng = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=256, speculative=speculative,
                                                      cpu_decode_step=False))
        for i, p in enumerate(prompts):
            eng.add_request(str(i), p, greedy(16))
        return eng, run_to_completion(eng)

    plain_engine, plain = go(None)
    assert "speculative" in str(plain_engine.executor.fast_path.panels)
    calls = []
    real = panel_cpu.linear
    monkeypatch.setattr(panel_cpu, "linear", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    spec_engine, spec = go({"method": "ngram", "num_tokens": 3})
    assert spec_engine.executor.fast_path.panels.layers > 0
    assert spec == plain
    assert calls and max(calls) > 1
