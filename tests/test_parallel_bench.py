"""`minillm bench tp` end to end on a tiny random model (tp=2): the JSON's shape and its checks, no timing claims."""
from __future__ import annotations

import json

import pytest

from minillm.bench.cli import main
from minillm.bench.tp import TPWorkload
from tests.helpers.tiny_models import make_tiny_hf_model

pytestmark = pytest.mark.slow  # one worker process (~6 s of CPU)


def test_bench_tp_json(tmp_path, capsys):
    folder, _ = make_tiny_hf_model(tmp_path, "llama", num_attention_heads=8, num_key_value_heads=4)
    out = tmp_path / "tp.json"
    assert main(["tp", "--model", str(folder), "--tp", "2", "--num-prompts", "3", "--prompt-len", "20",
                 "--output-len", "5", "--bare-repeats", "3", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "tp" and report["settings"]["backend"] == "gloo"
    assert report["machine"]["versions"]["torch"]
    s = report["measured"]["summary"]
    assert s["tokens_identical"] and s["bytes_match_analytic"]
    assert s["max_abs_logprob_diff"] < 1e-4
    steps = report["measured"]["runs"]["tp2"]["steps"]
    assert all(st["allreduce_bytes"] == st["allreduce_bytes_analytic"] > 0 for st in steps)
    assert all(st["allreduce_bytes"] == 0 for st in report["measured"]["runs"]["tp1"]["steps"])
    assert s["decode"]["allreduce_bytes"] == (2 * 2 + 1) * 3 * 64 * 4  # 3 decode tokens, hidden 64, fp32
    assert s["decode"]["bare_allreduce_s"] > 0  # the same payload timed among bare processes
    assert s["decode"]["bare_comm_per_step_s"] == pytest.approx(5 * s["decode"]["bare_allreduce_s"])
    rows = report["analytic"]["rows"]
    assert {r["model"] for r in rows} == {"Llama-2-7B", "Llama-2-70B"}
    assert {r["link"] for r in rows} == {"NVLink 4 (H100 SXM)", "PCIe Gen5 x16"}
    assert "NVLink 4" in capsys.readouterr().out


def test_bad_tp_workload():
    with pytest.raises(ValueError, match="num_prompts"):
        TPWorkload(num_prompts=0)
    with pytest.raises(SystemExit):
        main(["tp", "--tp", "two"])
