"""int8/int4 layers on CPUs without bf16 instructions: the same codes as GGUF blocks, integer kernels (issue 20).

The outside reference for the block format is gguf-py's dequantizer; the layer's product is
checked against x @ W.T of the codes it was given. The AVX2-only route is exercised on any
machine in a subprocess with ATEN_CPU_CAPABILITY=avx2 (torch then runs no bf16 instructions).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from minillm.quant.cpu_route import CpuFeatures, int4_as_q4_1, int8_as_q8_0, quant_cpu_route
from minillm.quant.int4 import quantize_int4, unpack_int4
from minillm.quant.int8 import quantize_int8
from minillm.quant.linear import QuantLinear

gguf_cpu = pytest.importorskip("minillm.cpu.kernels.gguf_cpu")
if not gguf_cpu.available()[0]:
    pytest.skip(f"GGUF block kernels unavailable: {gguf_cpu.available()[1]}", allow_module_level=True)
gguf = pytest.importorskip("gguf")


def weight(n: int = 96, k: int = 256, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05 + 0.01  # off-centre: groups have non-zero means


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_groups_become_q4_1_blocks_that_gguf_py_reads_as_the_same_weights(group_size):
    q = quantize_int4(weight(), group_size)
    blocks = int4_as_q4_1(unpack_int4(q.qweight, q.in_features), q.scale_zeros, group_size)
    theirs = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType.Q4_1)
    ours = q.dequantize().numpy()
    step = (q.scale_zeros[..., 0].abs().max()).item()  # one int4 step of the coarsest group
    # the codes are the same; d and m are rounded to fp16 (2^-11 relative): far below a step
    assert np.abs(theirs - ours).max() < 0.02 * step
    assert np.abs(theirs - ours).max() > 0  # fp16 scales really are stored (not the float32 ones)


def test_int8_rows_become_q8_0_blocks_that_gguf_py_reads_as_the_same_weights():
    q = quantize_int8(weight())
    theirs = gguf.quants.dequantize(int8_as_q8_0(q.qweight, q.scales).numpy(), gguf.GGMLQuantizationType.Q8_0)
    ours = q.dequantize().numpy()
    assert np.abs(theirs - ours).max() <= 2 ** -10 * np.abs(ours).max()


@pytest.mark.parametrize("bits,group_size", [(4, 32), (4, 64), (8, None)])
def test_the_blocks_layer_multiplies_like_its_codes(bits, group_size):
    w = weight(n=80, k=192)
    plain = QuantLinear.from_float(w, bits, group_size, bias=torch.linspace(-1, 1, 80))
    blocks = QuantLinear.from_float(w, bits, group_size, bias=torch.linspace(-1, 1, 80))
    assert blocks.use_cpu_kernels(route="blocks") and blocks.layout == "blocks"
    x = torch.randn(5, 192, generator=torch.Generator().manual_seed(1))
    ref, got = plain(x), blocks(x)
    rel = ((got - ref).norm() / ref.norm()).item()
    # the int8 activation blocks are the one new rounding: ~0.5% of the output's norm, never exact
    assert 1e-5 < rel < 1.5e-2, rel
    assert torch.allclose(blocks.dequantize(), plain.dequantize(), rtol=0, atol=0.02 * plain.dequantize().abs().max())
    if bits == 4:  # fp16 (d, m) per 32 weights instead of float32 (scale, zero) per group: fewer bytes up to group 64
        assert blocks.weight_bytes() <= plain.weight_bytes() and (group_size > 32 or blocks.weight_bytes() < plain.weight_bytes())


def test_the_route_follows_the_cpu_features(monkeypatch):
    monkeypatch.delenv("MINILLM_QUANT_CPU_ROUTE", raising=False)
    assert CpuFeatures("AVX512", avx512_bf16=True, amx=False).native_bf16
    assert CpuFeatures("AVX512", avx512_bf16=False, amx=True).native_bf16
    assert not CpuFeatures("AVX512", avx512_bf16=False, amx=False).native_bf16  # AVX-512 without BF16 (Skylake-X)
    assert not CpuFeatures("AVX2", avx512_bf16=True, amx=True).native_bf16  # torch told to run its AVX2 kernels
    import minillm.quant.cpu_route as cr

    # the default is the route measured faster at batch-1 decode on each kind of CPU (cpu_route.py)
    monkeypatch.setattr(cr, "cpu_features", lambda: CpuFeatures("AVX2", False, False))  # Zen 2/3, Intel client
    monkeypatch.setattr(cr, "_blocks_available", lambda: (True, ""))
    route, why = quant_cpu_route()
    assert route == "blocks" and "no bf16 hardware (torch AVX2)" in why
    monkeypatch.setattr(cr, "_blocks_available", lambda: (False, "no compiler"))
    route, why = quant_cpu_route()
    assert route == "bf16" and "no compiler" in why
    monkeypatch.setattr(cr, "_blocks_available", lambda: (True, ""))
    monkeypatch.setattr(cr, "cpu_features", lambda: CpuFeatures("AVX2", True, True))  # AMX Xeon, torch on AVX2
    route, why = quant_cpu_route()
    assert route == "bf16" and "limited to AVX2" in why
    monkeypatch.setattr(cr, "cpu_features", lambda: CpuFeatures("AVX512", True, False))
    assert quant_cpu_route() == ("bf16", "native bf16 (AVX-512 BF16, torch AVX512)")
    monkeypatch.setenv("MINILLM_QUANT_CPU_ROUTE", "blocks")
    assert quant_cpu_route() == ("blocks", "MINILLM_QUANT_CPU_ROUTE=blocks")
    monkeypatch.setenv("MINILLM_QUANT_CPU_ROUTE", "fp16")
    with pytest.raises(ValueError, match="MINILLM_QUANT_CPU_ROUTE"):
        quant_cpu_route()


AVX2_CHILD = r"""
import json, torch
from minillm.quant.linear import QuantLinear
from minillm.quant.cpu_route import quant_cpu_route
from minillm.roofline.machine import cpu_kernels
torch.manual_seed(0)
w = torch.randn(64, 128) * 0.05
x = torch.randn(3, 128)
m = QuantLinear.from_float(w, 4, 32)
plain = m(x)
m.use_cpu_kernels()
print(json.dumps({"route": quant_cpu_route()[0], "layout": m.layout, "kernels": cpu_kernels(),
                  "rel": ((m(x) - plain).norm() / plain.norm()).item()}))
"""


@pytest.mark.slow
def test_an_avx2_only_torch_runs_the_avx2_block_kernels_and_records_its_features():
    env = {k: v for k, v in os.environ.items() if k != "MINILLM_QUANT_CPU_ROUTE"}
    env["ATEN_CPU_CAPABILITY"] = "avx2"
    env["MINILLM_QUANT_CPU_ROUTE"] = "blocks"
    out = subprocess.run([sys.executable, "-c", AVX2_CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["route"] == "blocks" and res["layout"] == "blocks"
    assert res["kernels"]["torch_cpu_capability"] == "AVX2" and res["kernels"]["native_bf16"] is False
    assert res["kernels"]["gguf_blocks"] is not None and "avx512" not in res["kernels"]["gguf_blocks"]
    assert 1e-5 < res["rel"] < 1.5e-2


@pytest.mark.slow  # the default model, quantized twice, 4 windows of 128 tokens teacher-forced (~15 s)
@pytest.mark.default_model
def test_the_default_model_on_the_block_route_stays_with_the_float_model(default_model, monkeypatch):
    from minillm import LLM, SamplingParams
    from minillm.eval import corpus_tokens, windows
    from minillm.eval.paged import score_windows

    monkeypatch.setenv("MINILLM_QUANT_CPU_ROUTE", "blocks")
    llm = LLM(quantization="int4", num_kv_blocks=64)
    assert llm.quantization_report["kernels"].startswith("blocks:")
    layers = [m for m in llm.loaded.model.modules() if isinstance(m, QuantLinear)]
    assert len(layers) == 4 * 30 and {m.layout for m in layers} == {"blocks"}
    wins = windows(corpus_tokens(llm.tokenizer, "eval", 4 * 128), 128, 4)
    ref = score_windows(default_model.model, wins)
    got = score_windows(llm.loaded.model, wins)
    agree = (ref.top1 == got.top1).double().mean().item()
    # int4 g32 lands on the file's own Q4_1 grid (the model is a dequantized Q4_1), so the int8
    # activation blocks are the difference: the same bounds as quantization="gguf" (test_gguf_blocks_model)
    assert agree >= 0.95, agree
    assert got.perplexity / ref.perplexity < 1.015, (got.perplexity, ref.perplexity)
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))[0]
    assert out.outputs[0].text.strip()
