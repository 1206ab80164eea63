"""Mixture of experts (models/moe.py, models/moe_models.py) against transformers and a per-token reference.

Tiny random Mixtral and Qwen2-MoE models are built with transformers, saved with
save_pretrained (one tensor per expert, the names real checkpoints use) and loaded by
minillm's loader. fp32 on both sides, same weights: what is left is summation order.
Measured max |logit diff| <= 1.2e-5 on logits of magnitude 5-8 (prefill, 40 tokens),
max |logprob diff| <= 7e-6 through the engine's paged decode; tolerance 1e-4 (2e-4 for
logprobs). The block itself is checked against a loop over tokens that applies the
routing rule literally.
"""
from __future__ import annotations

import json

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.config import ModelConfig
from minillm.engine.cost import step_cost
from minillm.loader import ModelLoadError, load_model
from minillm.loader.base import empty_model, fill_model
from minillm.models.moe import SparseMoeBlock, take_routed_tokens
from minillm.models.moe_models import MixtralForCausalLM, Qwen2MoeForCausalLM
from minillm.models.standalone import forward_logits
from minillm.parallel.shard import check_tp_size
from tests.helpers.tiny_moe import MOE_FAMILIES, make_tiny_moe

ATOL = 1e-4
LOGPROB_ATOL = 2e-4  # a logprob is a logit minus a logsumexp: up to twice a logit's error
ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16, seed=0)  # paged, chunked, batched
PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60], [1, 7, 8, 9],
           [1, 200, 100, 250, 17, 300, 5]]  # the first is longer than one step's 16-token budget


@pytest.fixture(scope="module", params=sorted(MOE_FAMILIES))
def tiny(request, tmp_path_factory):
    family = request.param
    folder, hf = make_tiny_moe(tmp_path_factory.mktemp(family), family)
    return family, folder, hf, load_model(str(folder))


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


# ---------------------------------------------------------------- the block, alone


def tiny_block(num_experts: int, top_k: int, norm: bool, shared: int, seed: int = 0) -> SparseMoeBlock:
    cfg = ModelConfig(vocab_size=8, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, num_experts=num_experts, num_experts_per_tok=top_k,
                      moe_intermediate_size=12, norm_topk_prob=norm, shared_expert_intermediate_size=shared)
    torch.manual_seed(seed)
    block = SparseMoeBlock(cfg)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.4)
    return block


def per_token_reference(block: SparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    """The routing rule applied token by token, each expert as three separate matmuls."""
    ex, inter = block.experts, block.experts.intermediate
    out = []
    for t in range(x.shape[0]):
        p = torch.softmax(block.gate.weight @ x[t], dim=0)
        top = sorted(range(block.num_experts), key=lambda e: -p[e].item())[: block.top_k]
        total = sum(p[e] for e in top)
        y = torch.zeros_like(x[t])
        for e in top:
            w_gate, w_up = ex.gate_up_proj[e][:inter], ex.gate_up_proj[e][inter:]
            h = torch.nn.functional.silu(w_gate @ x[t]) * (w_up @ x[t])
            y += (p[e] / total if block.norm_topk_prob else p[e]) * (ex.down_proj[e] @ h)
        if block.shared_expert is not None:
            y += torch.sigmoid(block.shared_expert_gate.weight @ x[t])[0] * block.shared_expert(x[t : t + 1])[0]
        out.append(y)
    return torch.stack(out) if out else x.new_zeros(x.shape)


@pytest.mark.parametrize("num_experts, top_k, norm, shared, tokens", [
    (4, 2, True, 0, 9),  # Mixtral's rule
    (8, 2, False, 20, 13),  # Qwen2-MoE's: raw top-k probabilities, a shared expert
    (8, 3, True, 20, 1),  # one token: most experts get nothing
    (6, 6, False, 0, 5),  # k = E: every expert sees every token, weights sum to 1 anyway
    (5, 1, True, 0, 0),  # an empty step
])
@torch.no_grad()
def test_block_matches_per_token_reference(num_experts, top_k, norm, shared, tokens):
    block = tiny_block(num_experts, top_k, norm, shared)
    x = torch.randn(tokens, 16, generator=torch.Generator().manual_seed(1))
    out = block(x)
    torch.testing.assert_close(out, per_token_reference(block, x), atol=1e-5, rtol=1e-5)
    counts = block.routed_tokens.tolist()
    assert sum(counts) == tokens * top_k and len(counts) == num_experts
    _, chosen = block.route(x)
    assert counts == torch.bincount(chosen.reshape(-1), minlength=num_experts).tolist()


# ---------------------------------------------------------------- against transformers


def test_config_and_weights_load(tiny):
    family, _, hf, loaded = tiny
    cfg, ref = loaded.config, hf.config
    assert isinstance(loaded.model, MixtralForCausalLM if family == "mixtral" else Qwen2MoeForCausalLM)
    assert cfg.num_experts == getattr(ref, "num_local_experts", getattr(ref, "num_experts", None))
    assert cfg.num_experts_per_tok == ref.num_experts_per_tok
    moe = [i for i, layer in enumerate(hf.model.layers) if "SparseMoe" in type(layer.mlp).__name__]
    assert [i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)] == moe
    assert [i for i, layer in enumerate(loaded.model.layers) if isinstance(layer.mlp, SparseMoeBlock)] == moe
    # the parameter count every analytic view uses is transformers' own (tied tables counted once)
    assert cfg.num_parameters() == sum(p.numel() for p in hf.parameters())


def test_prefill_logits_match_transformers(tiny):
    _, _, hf, loaded = tiny
    gen = torch.Generator().manual_seed(3)
    for n in (1, 7, 40):
        ids = torch.randint(3, 320, (n,), generator=gen).tolist()
        ours, ref = forward_logits(loaded.model, ids), hf_logits(hf, ids)
        diff = (ours - ref).abs().max().item()
        print(f"{n} tokens: max |logit diff| {diff:.2e} (logits up to {ref.abs().max():.1f})")
        assert diff < ATOL


def test_fused_expert_tensors_load_too(tiny):
    """transformers' in-memory layout (experts.gate_up_proj / down_proj as 3-D tensors) loads to the same model."""
    _, folder, hf, loaded = tiny
    state = hf.state_dict()
    assert any(k.endswith("experts.gate_up_proj") for k in state)
    model = fill_model(empty_model(loaded.config, torch.float32, "cpu"), state.items(), "state_dict")
    ids = list(range(3, 30))
    assert torch.equal(forward_logits(model, ids), forward_logits(loaded.model, ids))


def test_engine_decode_and_greedy_match_transformers(tiny):
    """Batched prompts through the engine (paged KV in 4-token blocks, chunked prefill): every sampled token's
    logprobs equal transformers' over the same sequence, and the greedy tokens are transformers' generate."""
    _, folder, hf, _ = tiny
    llm = LLM(str(folder), **ENGINE)
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=3)
    outs = llm.generate(PROMPTS, sp, use_tqdm=False)
    worst = 0.0
    for ids, out in zip(PROMPTS, outs):
        got = out.outputs[0]
        ref = torch.log_softmax(hf_logits(hf, ids + list(got.token_ids)), dim=-1)
        for i, top in enumerate(got.logprobs):
            row = ref[len(ids) - 1 + i]
            worst = max(worst, max(abs(lp - row[tok].item()) for tok, lp in top.items()))
        with torch.no_grad():
            theirs = hf.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False, pad_token_id=0)[0, len(ids):]
        assert theirs.numel() and list(got.token_ids[: theirs.numel()]) == theirs.tolist()  # theirs may stop at EOS
    print(f"max |logprob diff| over decode steps {worst:.2e}")
    assert worst < LOGPROB_ATOL
    # the trace: every MoE layer routed top_k assignments per token of every step
    k, layers = llm.loaded.config.num_experts_per_tok, llm.trace[0].moe_layers
    assert layers and all(len(t.expert_tokens) == len(layers) for t in llm.trace)
    for t in llm.trace:
        assert all(sum(row) == k * t.num_tokens for row in t.expert_tokens)


def test_traced_counts_are_transformers_routing(tiny):
    """One prompt prefilled in one step: its tokens per expert per layer, as transformers' routers choose them."""
    _, folder, hf, _ = tiny
    ids = PROMPTS[0]
    llm = LLM(str(folder), **{**ENGINE, "max_num_batched_tokens": 64})
    forward_logits(llm.loaded.model, ids[:5])  # a forward outside the engine's steps is not counted in them
    llm.generate([ids], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    (step,) = llm.trace
    with torch.no_grad():
        router_logits = hf(torch.tensor([ids]), output_router_logits=True).router_logits
    k, e = llm.loaded.config.num_experts_per_tok, llm.loaded.config.num_experts
    want = [torch.bincount(r.topk(k, dim=-1).indices.reshape(-1), minlength=e).tolist() for r in router_logits]
    assert [list(row) for row in step.expert_tokens] == want
    assert len(step.moe_layers) == len(router_logits)


# ---------------------------------------------------------------- what it refuses, what it costs


def test_bad_moe_configs_are_clear_errors(tmp_path):
    base = dict(vocab_size=8, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=2)
    with pytest.raises(ValueError, match="num_experts_per_tok=5 must be between 1 and num_experts=4"):
        ModelConfig(**base, num_experts=4, num_experts_per_tok=5)
    with pytest.raises(ValueError, match="num_experts_per_tok=0"):
        ModelConfig(**base, num_experts=4)
    with pytest.raises(ValueError, match="must divide the 6 experts"):
        check_tp_size(ModelConfig(**{**base, "num_attention_heads": 4, "num_key_value_heads": 4}, num_experts=6,
                                  num_experts_per_tok=2), 4)
    folder, _ = make_tiny_moe(tmp_path, "mixtral")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 9}))
    with pytest.raises(ModelLoadError, match="config.json.*num_experts_per_tok=9 must be between 1 and num_experts=4"):
        load_model(str(folder))
    (folder / "config.json").write_text(json.dumps({**config, "num_local_experts": 3}))  # the file holds 4
    with pytest.raises(ModelLoadError, match="expert 3 but the config has 3 experts"):
        load_model(str(folder))
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="compile=True is not supported for mixture-of-experts"):
        LLM(str(folder), compile=True, **ENGINE)
    with pytest.raises(ValueError, match="quantization is not supported for mixture-of-experts models"):
        LLM(str(folder), quantization="int8", **ENGINE)


def test_missing_expert_tensor_is_named(tiny):
    """One expert's up matrix left out of the saved file: the error names its slice of our 3-D parameter."""
    from safetensors.torch import load_file

    _, folder, _, loaded = tiny
    state = load_file(str(folder / "model.safetensors"))
    dropped = next(k for k in state if ".experts.1.w3." in k or ".experts.1.up_proj." in k)
    layer = dropped.split(".")[2]
    del state[dropped]
    model = empty_model(loaded.config, torch.float32, "cpu")
    missing = rf"missing tensors for layers\.{layer}\.mlp\.experts\.gate_up_proj\[1\]\[1\]$"
    with pytest.raises(ModelLoadError, match=missing):
        fill_model(model, state.items(), "model.safetensors")


def test_step_cost_counts_the_active_experts(tiny):
    """A token's FLOPs: attention projections, the router, k of E experts, the shared expert -- not all E."""
    _, _, _, loaded = tiny
    cfg = loaded.config
    h, d, n = cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers
    attn = h * (cfg.num_attention_heads * d + 2 * cfg.num_key_value_heads * d) + cfg.num_attention_heads * d * h
    expert = 3 * h * cfg.moe_intermediate_size
    shared = 3 * h * cfg.shared_expert_intermediate_size + h if cfg.shared_expert_intermediate_size else 0
    mlp = sum(h * cfg.num_experts + cfg.num_experts_per_tok * expert + shared if cfg.is_moe_layer(i)
              else 3 * h * cfg.intermediate_size for i in range(n))
    one = step_cost(cfg, [(1, 1)], 0, 4, 4)  # one token, attending to itself only
    attention = 2 * 2 * n * cfg.num_attention_heads * d  # QK^T and PV over one key
    assert one.flops == pytest.approx(2 * (n * attn + mlp) + attention)
    dense_equivalent = sum(cfg.mlp_parameters(i) for i in range(n))  # every expert: what a dense model would cost
    assert mlp < dense_equivalent


def test_take_routed_tokens_resets(tiny):
    _, _, _, loaded = tiny
    take_routed_tokens(loaded.model)
    forward_logits(loaded.model, [1, 2, 3])
    first = take_routed_tokens(loaded.model)
    assert all(sum(row) == 3 * loaded.config.num_experts_per_tok for row in first.counts)
    assert all(sum(row) == 0 for row in take_routed_tokens(loaded.model).counts)
