"""`minillm bench quant` on the default model: bytes per token match the tensors, the run produces a report."""
from __future__ import annotations

import json

import pytest

from minillm.bench.quant import build_subject, format_quant, measure_quant
from minillm.bench.workload import LatencyWorkload
from minillm.quant import QuantLinear
from minillm.quant.footprint import weight_bytes_per_token


def _analytic_int8_bytes(cfg) -> int:
    """Embedding/LM head (tied, fp32) + fp32 norms + every decoder linear as int8 codes + one fp32 scale per row."""
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes = [(q + 2 * kv, h), (h, q), (2 * i, h), (h, i)]  # (out, in): qkv, o, gate_up, down
    per_layer = sum(n * k + n * 2 for n, k in shapes) + 2 * h * 4  # CPU layout keeps the scales bf16
    return cfg.vocab_size * h * 4 + h * 4 + cfg.num_hidden_layers * per_layer


@pytest.mark.slow
def test_bench_quant_reports_bytes_that_match_the_tensors(default_model):
    wl = LatencyWorkload(prompt_len=8, output_len=4, prefill_len=0)
    rows = measure_quant(default_model, ("float", "int8", "kv-int8"), wl, bandwidth=1e10, repeats=1)
    by = {r.setting: r for r in rows}
    cfg = default_model.model.config
    assert by["float"].weight_bytes_per_token == sum(p.numel() * 4 for p in default_model.model.parameters())
    assert by["int8"].weight_bytes_per_token == _analytic_int8_bytes(cfg)
    kv_f = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4
    assert by["float"].kv_bytes_per_token == kv_f
    assert by["kv-int8"].kv_bytes_per_token == kv_f // 4 + cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * 4
    for r in rows:
        assert len(r.tok_s) == 1 and r.tok_s[0] > 0
        assert r.roof_tok_s == pytest.approx(1e10 / (r.weight_bytes_per_token + r.mean_kv_read_bytes))
    assert "llama.cpp" in format_quant(rows, 1e10)
    json.dumps([r.to_dict() for r in rows])


@pytest.mark.slow
def test_gguf_setting_holds_no_float_copy_of_the_decoder_linears(default_model):
    _, model, s = build_subject(default_model, "gguf")
    from minillm.cpu.kernels.gguf_cpu import available
    from minillm.quant.gguf_linear import GGUFLinear

    assert s.quantization == "gguf"
    layers = model.config.num_hidden_layers
    if available()[0]:  # the file's blocks, the LM head too (minillm.quant.gguf_linear)
        assert sum(isinstance(m, GGUFLinear) for m in model.modules()) == 4 * layers + 1
    else:  # the int4 mapping of the Q4_1 codes
        assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 4 * layers
    # what is left in float: the tied embedding / LM head and the norms
    floats = {n for n, p in model.named_parameters()}
    assert all(n.endswith("norm.weight") or n == "embed_tokens.weight" for n in floats), floats
    assert weight_bytes_per_token(model) < 0.35 * weight_bytes_per_token(default_model.model)
