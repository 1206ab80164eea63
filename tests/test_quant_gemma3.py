"""AWQ on Gemma 3: its scales fold into the norm right before each matmul, which for Gemma's MLP is
pre_feedforward_layernorm, a norm that scales by (1 + w)."""
from __future__ import annotations

import copy

import torch

from minillm.config import ModelConfig
from minillm.models.gemma3 import Gemma3ForCausalLM
from minillm.models.layers import RMSNorm
from minillm.quant import quantize_model
from minillm.quant.targets import divide_norm


def test_folding_into_a_unit_offset_norm_is_exact():
    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-6, unit_offset=True)
    with torch.no_grad():
        norm.weight.normal_(0, 0.3)
    x, s = torch.randn(5, 64), torch.rand(64) + 0.5
    before = norm(x)
    with torch.no_grad():
        divide_norm(norm, s)
    torch.testing.assert_close(norm(x) * s, before, atol=1e-5, rtol=1e-5)


def tiny_gemma() -> Gemma3ForCausalLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                      eos_token_id=[], model_type="gemma3", hidden_activation="gelu_pytorch_tanh",
                      query_pre_attn_scalar=16, sliding_window=8,
                      layer_types=["sliding_attention", "full_attention"], rope_local_base_freq=10000.0,
                      rope_theta=1e6, qk_norm=True)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.3 if "norm" in name else 0.08)
    return model


def test_awq_on_gemma3_is_no_worse_than_round_to_nearest():
    from minillm.eval import score_windows

    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(5))
    model = tiny_gemma()
    ref_logits, out = [], {}
    ref = score_windows(model, ids, chunk_size=8, block_size=4, on_logits=ref_logits.append)
    for method in ("int4", "int4-awq"):
        q = copy.deepcopy(model)
        quantize_model(q, method, calibration=ids if method == "int4-awq" else None)
        logits = []
        score_windows(q, ids, chunk_size=8, block_size=4, on_logits=logits.append)
        a, b = torch.cat(ref_logits, 1), torch.cat(logits, 1)
        out[method] = ((b - a).norm() / a.norm()).item()
    # AWQ searches its scales to lower the error; a scale folded into the wrong norm (or as 1/s of
    # a (1 + w) norm taken for w) adds an error of its own instead
    assert out["int4-awq"] <= out["int4"] * 1.1, out
    assert ref.perplexity > 0
