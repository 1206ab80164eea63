"""`minillm bench structured` on a tiny random model: the JSON's shape and sane values, no timing claims.

What can fail here: the plain run must get exactly the constrained run's output lengths (else the
step ratio compares different batches); masks must show in the constrained run's trace and never in
the plain one's; every schema must compile cold on a fresh compiler, and again as a cache hit with no
compile; the report must survive JSON and carry the machine and the batch-1 target.
"""
from __future__ import annotations

import json

import pytest

from minillm.bench.cli import main
from minillm.bench.structured import COMPILE_SCHEMAS, PERSON_SCHEMA, bench_structured, format_structured
from tests.helpers.tiny_models import make_tiny_hf_model

pytest.importorskip("xgrammar")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    from minillm import LLM

    folder, _ = make_tiny_hf_model(tmp_path_factory.mktemp("m"), "llama")
    with LLM(str(folder), num_kv_blocks=128, block_size=16) as llm:
        yield llm


def test_bench_structured_report(tiny_llm):
    report, summary = bench_structured(tiny_llm, batch_sizes=[1, 2], repeats=1, max_tokens=6, num_schemas=2)
    report = json.loads(json.dumps(report))
    assert report["benchmark"] == "structured"
    assert report["machine"]["cpu_model"] and report["machine"]["torch_threads"] >= 1
    assert isinstance(report["machine"]["cpu_flags"], list)
    assert report["workload"]["schema"] == PERSON_SCHEMA

    assert [b["batch"] for b in report["tpot"]] == [1, 2]
    for b, run in zip(report["tpot"], report["runs"]):
        assert b["step_ratio"]["median"] > 0 and len(b["step_ratio"]["values"]) == 1
        assert b["tpot_ms_plain"]["median"] > 0 and b["tpot_ms_constrained"]["median"] > 0
        assert 0 < b["mask_share"]["median"] < 1 and b["mask_us_per_row"]["median"] > 0
        assert b["same_lengths_every_repeat"]
        assert len(run["lengths"]) == b["batch"] and all(1 <= n <= 6 for n in run["lengths"])
        (rep,) = run["repeats"]
        assert rep["plain"]["grammar_rows"] == 0 and rep["plain"]["grammar_s"] == 0
        # one masked row per output token: the prefill's last row, then one per decode step
        assert rep["constrained"]["grammar_rows"] == sum(run["lengths"])
        assert rep["constrained"]["decode_steps"] == rep["plain"]["decode_steps"] > 0
        assert rep["step_ratio"] > 0 and rep["wall_ratio"] > 0
    # the TPOT schema compiled once in the engine: the second batch size found it cached
    assert [r["compiles_before_first_run"] for r in report["runs"]] == [1, 0]
    assert len(report["compile"]["engine_compile_seconds"]) == 1

    comp = report["compile"]
    assert [s["name"] for s in comp["schemas"]] == list(COMPILE_SCHEMAS)[:2]
    for s in comp["schemas"]:
        assert s["cold_compile_s"]["median"] > 0 and s["schema_bytes"] > 0
        assert s["cache_hit_s"]["median"] >= 0
    assert comp["compiles_on_cache_hit"] == 0
    assert comp["tokenizer_setup_s"]["median"] > 0

    (t,) = report["targets"]
    assert t["name"] == "structured_tpot_batch1" and t["value"] == pytest.approx(1 / report["batch1_step_ratio"])
    text = format_structured(summary)
    assert "batch   1" in text and "batch   2" in text and "structured_tpot_batch1" in text


def test_bench_structured_cli(tmp_path, capsys):
    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    out = tmp_path / "s.json"
    assert main(["structured", "--model", str(folder), "--batch", "2", "--repeats", "1", "--max-tokens", "4",
                 "--num-schemas", "1", "--quiet", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["settings"]["batch_sizes"] == [2] and report["settings"]["llm_options"] == "LLM() defaults"
    assert report["targets"][0]["value"] is None  # no batch 1 in this run: not measured
    assert "batch   2" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["structured", "--model", str(folder), "--batch", "0"])
