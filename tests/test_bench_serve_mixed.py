"""`minillm bench serve --workload mixed` on tiny random models: the JSON's shape, no timing claims.

What can fail here: the workload must be seeded, its two classes must not overlap in the
engine's lane rule, every request of every policy must complete with exactly the tokens it
asked for, per class; the engine figures must come from each policy's own engine (the
length-aware one never holds more long sequences than its lane's seats).
"""
from __future__ import annotations

import json

import pytest

from minillm.bench.cli import main
from minillm.bench.report import jsonable
from minillm.bench.serve_mixed import MixedWorkload, format_mixed, measure_policies, parse_policies
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from tests.helpers.tiny_models import make_tiny_hf_model
from tests.helpers.tiny_tokenizer import EOS, make_tiny_tokenizer
from tests.test_server_helpers import printable_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY_MIXED = MixedWorkload(num_short=8, num_long=3, short_prompt_len_range=(4, 12), short_output_len_range=(2, 5),
                           long_prompt_len_range=(4, 8), long_output_len_range=(20, 30), short_rate=40.0,
                           long_rate=40.0)


def test_mixed_workload_is_seeded_and_validated():
    a, b = TINY_MIXED.requests(320), TINY_MIXED.requests(320)
    assert a == b and len(a) == 11
    assert [t for t, *_ in a] == sorted(t for t, *_ in a) and a[0][0] == 0.0
    assert sorted(c for *_, c, _ in a) == ["long"] * 3 + ["short"] * 8
    for _, prompt, n, cls, prio in a:  # the engine's lane rule sees the same classes
        assert (len(prompt) + n <= TINY_MIXED.short_max_tokens) == (cls == "short")
        assert prio == (1 if cls == "long" else 0)
    with pytest.raises(ValueError, match="overlap"):
        MixedWorkload(long_output_len_range=(8, 16))
    with pytest.raises(ValueError, match="rates"):
        MixedWorkload(short_rate=0)
    assert parse_policies("priority, fcfs,priority") == ["priority", "fcfs"]
    with pytest.raises(ValueError, match="unknown scheduling policy lifo"):
        parse_policies("fcfs,lifo")


def test_measure_policies_per_class():
    made = {}

    def make_engine(policy):
        made[policy] = LLMEngine(printable_tiny_model(), make_tiny_tokenizer(), [EOS],
                                 EngineConfig(block_size=4, num_kv_blocks=256, max_num_seqs=2,
                                              scheduling_policy=policy,
                                              short_lane_max_tokens=TINY_MIXED.short_max_tokens))
        return made[policy]

    summary = measure_policies(make_engine, make_tiny_tokenizer(), ["fcfs", "length-aware"], TINY_MIXED, 320)
    reqs = TINY_MIXED.requests(320)
    for policy in ("fcfs", "length-aware"):
        s = summary["policies"][policy]
        for cls in ("short", "long"):
            wanted = [n for _, _, n, c, _ in reqs if c == cls]
            assert s[cls]["num_completed"] == len(wanted) and s[cls]["num_errors"] == 0
            assert s[cls]["output_tokens"] == sum(wanted)  # ignore_eos: exactly max_tokens each
            for key in ("ttft_s", "e2e_s"):
                assert 0 < s[cls][key]["p50"] <= s[cls][key]["p99"]
            # a short request's 2-5 tokens can all reach the client in one streamed chunk on a fast machine
            # (a Zen 5 did it for most of them): its TPOT, as the client sees it, is then 0
            assert 0 <= s[cls]["tpot_s"]["p50"] <= s[cls]["tpot_s"]["p99"]
        assert s["all"]["num_completed"] == 11
        assert s["engine"]["num_steps"] == sum(1 for t in made[policy].trace if t.scheduled)
        assert s["engine"]["scheduling_policy"] == policy
        # the long requests were sent with their priority (1); the short ones and the warm-up with none
        assert sorted(a.priority for t in made[policy].trace for a in t.arrivals) == [0] * 9 + [1] * 3
    lanes = summary["policies"]["length-aware"]["engine"]["mean_running_per_lane"]
    assert set(lanes) == {"short", "long"} and lanes["long"] <= 1  # 2 seats, 1 kept for short requests
    assert set(summary["policies"]["fcfs"]["engine"]["mean_running_per_lane"]) == {"all"}
    assert summary["short_ttft_p99_cut_vs_fcfs"]["fcfs"] == 1.0
    assert json.dumps(jsonable(summary)) and "length-aware" in format_mixed(summary)


def test_mixed_cli(tmp_path, capsys):
    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    out = tmp_path / "mixed.json"
    argv = ["serve", "--workload", "mixed", "--model", str(folder), "--policies", "fcfs,priority",
            "--num-short", "3", "--num-long", "1", "--short-output-len-range", "2", "4",
            "--long-output-len-range", "70", "72", "--kv-cache-mb", "4", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "serve" and list(report["policies"]) == ["fcfs", "priority"]
    assert report["settings"]["max_num_seqs"] == 4 and report["settings"]["short_lane_max_tokens"] == 48 + 4
    assert report["workload"]["num_short"] == 3 and report["policies"]["priority"]["long"]["num_completed"] == 1
    assert [p["engine"]["scheduling_policy"] for p in report["policies"].values()] == ["fcfs", "priority"]
    assert "short-request TTFT P99 cut vs fcfs" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="drop --url"):
        main(["serve", "--workload", "mixed", "--url", "http://127.0.0.1:1"])
    with pytest.raises(SystemExit, match="unknown scheduling policy"):
        main(["serve", "--workload", "mixed", "--policies", "lifo"])
