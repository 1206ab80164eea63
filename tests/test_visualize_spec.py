"""The speculation view (visualize/spec_view.py): a step's guesses as a tree, the accepted path, the target's token."""
from __future__ import annotations

import pytest
import torch

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.trace import StepTrace
from minillm.sampling_params import SamplingParams
from minillm.spec_decode.medusa_heads import MedusaHeads
from minillm.visualize import spec_tree_view
from tests.helpers.engine_utils import random_prompts, run_to_completion, tiny_model

VOCAB = 31


def traced(spec_extra: dict):
    model = tiny_model(seed=1, vocab=VOCAB)
    heads = MedusaHeads(model.config.hidden_size, 3)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    e = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=128, max_num_seqs=4,
                                                speculative={"method": "medusa", "heads": heads, **spec_extra}))
    for i, p in enumerate(random_prompts(3, VOCAB, 4, 9, seed=2)):
        e.add_request(str(i), p * 2, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    run_to_completion(e)
    return e


@pytest.mark.parametrize("extra", [{"num_tokens": 3}, {"tree": [3, 2, 1]}])
def test_every_step_draws_the_proposals_the_path_and_the_target_token(extra):
    e = traced(extra)
    seen = 0
    for s, rec in enumerate(e.trace):
        view = spec_tree_view(e.trace, s)
        by_seq = {r.seq_id: r for r in rec.spec}
        out = {n.seq_id: n.token_ids for n in rec.new_tokens}
        for tree in view.seqs:
            r = by_seq[tree.seq_id]
            at = {n.index: n for n in tree.nodes}
            kinds = [n.kind for n in tree.nodes]
            assert kinds.count("root") == 1 and kinds.count("accepted") == r.num_accepted
            assert kinds.count("accepted") + kinds.count("rejected") == r.num_proposed
            # the accepted nodes form one path from the root, the target's token hangs at its end
            tip = -1
            for n in sorted((n for n in tree.nodes if n.kind == "accepted"), key=lambda n: n.depth):
                assert n.parent == tip
                tip = n.index
            targets = [n for n in tree.nodes if n.kind == "target"]
            assert len(targets) == 1 and targets[0].parent == tip and targets[0].label == str(out[tree.seq_id][-1])
            assert all(at[n.parent].depth == n.depth - 1 for n in tree.nodes if n.parent is not None)
            leaves = [n.y for n in tree.nodes if not any(m.parent == n.index for m in tree.nodes)]
            assert len(set(leaves)) == len(leaves)  # no two leaves drawn on one spot
            assert tree.is_tree == ("tree" in extra and any(p != j - 1 for j, p in enumerate(r.draft_parents or ())))
            seen += 1
    assert seen > 5
    # the view reads only the trace: the same after a JSON round trip
    again = [StepTrace.from_dict(r.to_dict()) for r in e.trace]
    assert spec_tree_view(again, 5) == spec_tree_view(e.trace, 5)


def test_spec_figure_and_dashboard_panel():
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from minillm.visualize import Dashboard, spec_tree_figure

    e = traced({"tree": [2, 2]})
    step = next(i for i, r in enumerate(e.trace) if any(x.num_proposed for x in r.spec))
    fig = spec_tree_figure(e.trace, step, decode=lambda t: f"t{t}")
    names = {t.name for t in fig.data}
    assert {"newest token", "guess accepted", "guess rejected", "target's own token"} <= names
    assert "tree" in fig.layout.title.text and fig.layout.meta == "minillm-spec"
    # a step without guesses (the run's last) shows the latest step that had them, and says so
    last = spec_tree_figure(e.trace, len(e.trace) - 1)
    assert len(last.data) > 0 and "latest with guesses" in last.layout.title.text or any(
        x.num_proposed for x in e.trace[-1].spec)
    assert spec_tree_figure(e.trace, 0).layout.meta == "minillm-spec"  # a prefill: nothing to draw yet
    dash = Dashboard.from_trace(e.trace)
    assert dash.spec is not None and dash.spec.widget in dash.widget.children
