"""`minillm bench quant`'s table on a tiny model: every scheme's row with memory, prefill, perplexity and agreement."""
from __future__ import annotations

import json
import sys

from minillm.bench.cli import main
from tests.helpers.tiny_models import make_tiny_hf_model


def test_every_scheme_gets_size_memory_quality_and_speed(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # no peer: this test is about minillm's rows
    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    out = tmp_path / "q.json"
    settings = ["float", "gptq", "w8a8", "fp8", "kv-int8"]
    assert main(["quant", "--model", str(folder), "--settings", ",".join(settings), "--prompt-len", "4",
                 "--output-len", "4", "--prefill-len", "32", "--repeats", "2", "--quality-windows", "2",
                 "--quality-len", "64", "--throughput-requests", "3", "--tasks", "code", "--task-limit", "2",
                 "--no-roofs", "--quiet", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "prefill/s" in text and "top-1" in text and "dequantized on every call" in text
    rows = {r["setting"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == settings
    for r in rows.values():
        assert len(r["prefill_tok_s"]) == 2 and r["median_prefill_tok_s"] > 0 and len(r["tok_s"]) == 2
        assert r["perplexity"] > 1 and 0 <= r["top1_agreement"] <= 1 and r["model_bytes"] > 0
    # the float row scores the very model the others are compared with
    assert rows["float"]["ppl_change_pct"] == 0 and rows["float"]["top1_agreement"] == 1
    assert all(rows[s]["top1_agreement"] < 1 and rows[s]["ppl_change_pct"] != 0 for s in ("gptq", "w8a8", "fp8"))
    # memory: fp8 / w8a8 keep one byte per decoder weight, gptq half a byte; the KV setting shares the float model
    assert rows["gptq"]["model_bytes"] < rows["fp8"]["model_bytes"] < rows["float"]["model_bytes"]
    assert rows["kv-int8"]["model_bytes"] == rows["float"]["model_bytes"]
    assert rows["kv-int8"]["kv_bytes_per_token"] < rows["float"]["kv_bytes_per_token"]
    # allocated = weights + the KV pool; batched throughput and the task suite per setting
    for r in rows.values():
        assert r["allocated_bytes"] == r["model_bytes"] + r["kv_pool_bytes"] and r["kv_pool_bytes"] > 0
        assert r["throughput_tok_s"] > 0 and r["task_total"] == 2 and 0 <= r["task_passed"] <= 2
    assert rows["kv-int8"]["kv_pool_bytes"] < rows["float"]["kv_pool_bytes"]  # same blocks, fewer bytes each
    assert rows["float"]["task_change_pts"] == 0
    assert all(r["task_change_pts"] == 100 * (r["task_score"] - rows["float"]["task_score"]) for r in rows.values())
    assert "batch/s" in text and "task" in text
