"""The routing view (visualize/moe_view.py, moe_plot.py) on the trace of a tiny random MoE model run by the engine."""
from __future__ import annotations

import math

import pytest
import torch

from minillm.config import ModelConfig
from minillm.engine.trace import dump_trace, load_trace
from minillm.models.moe_models import Qwen2MoeForCausalLM
from minillm.visualize import routing_figure, routing_view
from minillm.visualize.moe_view import coefficient_of_variation
from tests.helpers.engine_utils import greedy, make_engine, random_prompts, run_to_completion, tiny_model

VOCAB = 61


@pytest.fixture(scope="module")
def moe_trace():
    """Qwen2-MoE-shaped: 3 layers, layer 1 dense, 6 experts, top-2, a shared expert; four prompts, 6 tokens each."""
    cfg = ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, num_experts=6, num_experts_per_tok=2,
                      moe_intermediate_size=16, shared_expert_intermediate_size=24, mlp_only_layers=[1],
                      norm_topk_prob=False, model_type="qwen2_moe")
    torch.manual_seed(0)
    engine = make_engine(Qwen2MoeForCausalLM(cfg).eval(), max_num_batched_tokens=16)
    for i, p in enumerate(random_prompts(4, VOCAB, 5, 20, seed=1)):
        engine.add_request(str(i), p, greedy(6))
    run_to_completion(engine)
    return engine.trace


def test_counts_add_up_over_the_run_and_per_step(moe_trace):
    view = routing_view(moe_trace)
    assert view.layers == (0, 2) and view.num_experts == 6 and view.top_k == 2
    assert view.num_tokens == sum(t.num_tokens for t in moe_trace)
    for r in range(len(view.layers)):
        assert view.counts[r] == tuple(sum(t.expert_tokens[r][e] for t in moe_trace) for e in range(6))
        assert sum(view.counts[r]) == 2 * view.num_tokens
        assert math.isclose(sum(view.share(r)), 1.0)
    one = routing_view(moe_trace, 3, cumulative=False)
    assert (one.first_step, one.last_step) == (3, 3) and one.counts == moe_trace[3].expert_tokens
    upto = routing_view(moe_trace, 3)
    assert upto.num_tokens == sum(t.num_tokens for t in moe_trace[:4])


def test_load_balance_is_the_coefficient_of_variation():
    assert coefficient_of_variation([5, 5, 5, 5]) == 0.0
    assert coefficient_of_variation([8, 0, 0, 0]) == pytest.approx(math.sqrt(3))  # one expert takes all: sqrt(E-1)
    assert coefficient_of_variation([0, 0]) == 0.0
    assert coefficient_of_variation([1, 3]) == pytest.approx(0.5)


def test_figure_draws_the_counts(moe_trace):
    fig = routing_figure(moe_trace)
    (heat,) = fig.data
    view = routing_view(moe_trace)
    assert [tuple(row) for row in heat.z] == list(view.counts)
    assert list(heat.x) == [f"expert {e}" for e in range(6)]
    assert heat.y[0].startswith("layer 0 (CV") and heat.y[1].startswith("layer 2 (CV")
    assert f"{view.num_tokens} tokens" in fig.layout.title.text and fig.layout.meta == "minillm-moe"


def test_dense_and_empty_traces_get_a_placeholder():
    engine = make_engine(tiny_model())
    engine.add_request("a", [1, 2, 3], greedy(2))
    run_to_completion(engine)
    assert routing_view(engine.trace) is None and all(t.expert_tokens == () for t in engine.trace)
    assert "dense model" in routing_figure(engine.trace).layout.annotations[0].text
    assert "no engine steps" in routing_figure([]).layout.annotations[0].text


def test_counts_survive_a_trace_file(moe_trace, tmp_path):
    dump_trace(moe_trace, str(tmp_path / "t.jsonl"))
    loaded = load_trace(str(tmp_path / "t.jsonl"))
    assert [t.expert_tokens for t in loaded] == [t.expert_tokens for t in moe_trace]
    assert [t.moe_layers for t in loaded] == [t.moe_layers for t in moe_trace]
    assert routing_view(loaded) == routing_view(moe_trace)


def test_the_dashboard_shows_routing_for_a_moe_engine_and_not_for_a_dense_one(moe_trace):
    from minillm.visualize import Dashboard, Roofs

    roofs = Roofs(bandwidth=50e9, peak_flops=1e12)
    dash = Dashboard.from_trace(moe_trace, roofs=roofs)
    assert dash.routing is not None
    dash.show(len(moe_trace) - 1)
    assert dash.routing.widget.layout.meta == "minillm-moe"
    heat = dash.routing.widget.data[0]
    # cumulative counts at the last step: every routed token of the run, in the live widget
    assert sum(sum(row) for row in heat.z) == sum(sum(sum(layer) for layer in r.expert_tokens) for r in moe_trace)
    assert dash.routing.widget in dash.widget.children
    engine = make_engine(tiny_model(), max_num_batched_tokens=16)
    engine.add_request("d", [1, 2, 3], greedy(2))
    run_to_completion(engine)
    assert Dashboard(engine, roofs=roofs).routing is None
