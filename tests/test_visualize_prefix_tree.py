"""The radix tree view (visualize/prefix_tree_view.py) and its figure, on a traced tiny engine."""
from __future__ import annotations

import pytest

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.trace import StepTrace
from minillm.visualize import prefix_tree_view
from tests.helpers.engine_utils import greedy, random_prompts, run_to_completion, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def traced():
    """Two conversations of two turns on a pool small enough to evict; prefix_cache="radix"."""
    a, b, c, d = random_prompts(4, 97, 9, 14, seed=3)
    e = LLMEngine(tiny_model(), None, [], EngineConfig(block_size=4, num_kv_blocks=12, max_num_seqs=2,
                                                      max_num_batched_tokens=32, prefix_cache="radix"))
    for i, p in enumerate([a, b, a + c, b + d, a + c + d]):
        e.add_request(str(i), p, greedy(5))
        run_to_completion(e)  # one at a time: each turn finds the previous turns in the tree
    return e


def test_view_matches_the_tree_in_the_trace(traced):
    trace = traced.trace
    bs = 4
    seen_locked = seen_evictable = False
    for s, rec in enumerate(trace):
        view = prefix_tree_view(trace, s)
        at = {n.node_id: n for n in view.nodes}
        assert [n.node_id for n in view.nodes] == [r.node_id for r in rec.prefix_tree]
        assert sum(n.kind == "root" for n in view.nodes) == 1
        for n in view.nodes:
            if n.kind == "root":
                assert n.start == n.end == 0
                continue
            assert n.num_tokens == len(n.block_ids) * bs and n.end - n.start == n.num_tokens
            assert n.start == at[n.parent_id].end  # a node continues its parent's run
            assert (n.kind == "locked") == (n.lock_ref > 0)
            assert (n.evict_rank is None) == (n.kind == "locked")
        # the eviction order the view draws is the order the pool would hand blocks out
        ranked = sorted((n for n in view.nodes if n.evict_rank is not None), key=lambda n: n.evict_rank)
        order = [b for n in ranked for b in reversed(n.block_ids)]
        queued = [b for b in rec.free_queue if b in set(order)]
        assert order == queued
        assert view.num_evictable_blocks == len(order)
        assert view.num_cached_blocks == sum(rec.block_cached)
        leaves = [n.y for n in view.nodes if not any(m.parent_id == n.node_id for m in view.nodes)]
        assert len(set(leaves)) == len(leaves)  # no two leaves drawn on one row
        seen_locked |= view.num_locked_blocks > 0
        seen_evictable |= view.num_evictable_blocks > 0
    assert seen_locked and seen_evictable and any(r.blocks_evicted for r in trace)
    # branching: at some step a node (the root included) has two children
    assert any(sum(m.parent_id == n.node_id for m in v.nodes) >= 2
               for v in (prefix_tree_view(trace, s) for s in range(len(trace))) for n in v.nodes)
    # the view reads only the trace: the same after a JSON round trip
    again = [StepTrace.from_dict(r.to_dict()) for r in trace]
    assert prefix_tree_view(again, 7) == prefix_tree_view(trace, 7)


def test_prefix_tree_figure_and_dashboard_panel(traced):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from minillm.visualize import Dashboard, prefix_tree_figure

    fig = prefix_tree_figure(traced.trace, 10, decode=lambda ids: "t" + "-".join(map(str, ids)))
    assert {"in use (locked: kept)", "cached, evictable"} <= {t.name for t in fig.data}
    assert fig.layout.meta == "minillm-prefix-tree" and "radix prefix cache" in fig.layout.title.text
    view = prefix_tree_view(traced.trace, 10)
    drawn = sum(len([x for x in t.x if x is not None]) // 2 for t in fig.data if t.name in
                {"in use (locked: kept)", "cached, evictable"})
    assert drawn == len(view.nodes) - 1  # one bar per node
    dash = Dashboard(traced)
    assert dash.prefix_tree is not None and dash.prefix_tree.widget in dash.widget.children
    # the hash cache has no tree: no panel, and the figure says why
    hashed = LLMEngine(tiny_model(), None, [], EngineConfig(block_size=4, num_kv_blocks=20))
    hashed.add_request("x", [1, 2, 3, 4, 5], greedy(2))
    run_to_completion(hashed)
    assert Dashboard(hashed).prefix_tree is None
    assert "no radix" in prefix_tree_figure(hashed.trace).layout.annotations[0].text
