"""`minillm demo` hits the prefix cache (issue 16): its prompts share a chat template and a system prompt.

What can fail: requests admitted in the same step cannot hit each other's blocks (none is computed
yet), so the demo used to report 0 hit tokens; it now lets the first request arrive one step early.
"""
from __future__ import annotations

import re

import pytest

from minillm.cli import main as minillm_main
from minillm.cli import prefix_note, run_staggered
from tests.helpers.engine_utils import greedy, make_engine, run_to_completion, tiny_model

BLOCK = 4
SHARED = [5, 6, 7, 8, 9, 10, 11, 12, 13]  # two whole blocks and one token more
PROMPTS = [SHARED + [20 + i, 30 + i, 40 + i] for i in range(5)]


def hit_tokens(engine) -> int:
    return sum(r.prefix_hit_tokens for r in engine.trace)


def test_a_batch_arriving_at_once_gets_no_hits():
    """The cause: blocks are registered after the step that computes them."""
    engine = make_engine(tiny_model(), block_size=BLOCK)
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, greedy(3))
    run_to_completion(engine)
    assert hit_tokens(engine) == 0


def test_staggered_arrival_hits_the_first_requests_whole_blocks():
    engine = make_engine(tiny_model(), block_size=BLOCK)
    outs, token_ids = run_staggered(engine, PROMPTS, greedy(3))
    assert token_ids == PROMPTS
    assert [len(o.outputs[0].token_ids) for o in outs] == [3] * len(PROMPTS)
    assert hit_tokens(engine) == (len(PROMPTS) - 1) * 2 * BLOCK
    # the same tokens as without the cache
    plain = make_engine(tiny_model(), block_size=BLOCK, prefix_caching=False)
    for i, p in enumerate(PROMPTS):
        plain.add_request(f"r{i}", p, greedy(3))
    done = run_to_completion(plain)
    assert [o.outputs[0].token_ids for o in outs] == [done[f"r{i}"] for i in range(len(PROMPTS))]


def test_prefix_note_counts_whole_blocks():
    note = prefix_note(PROMPTS, BLOCK, enabled=True)
    assert "9 leading tokens" in note and "8 of them in whole 4-token blocks" in note
    assert "off" in prefix_note(PROMPTS, BLOCK, enabled=False)


@pytest.mark.default_model
@pytest.mark.slow
def test_demo_summary_reports_prefix_hits(capsys):
    assert minillm_main(["demo", "--num-prompts", "3", "--max-tokens", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    hits = int(re.search(r"prefix cache: (\d+) tokens hit", out).group(1))
    whole = int(re.search(r"(\d+) of them in whole 16-token blocks", out).group(1))
    assert whole >= 16 and hits == 2 * whole, out
