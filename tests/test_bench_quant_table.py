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
    assert rows["float"]["task_flips"] == 0 and all(len(r["task_verdicts"]) == 2 for r in rows.values())
    assert all(r["task_flips"] >= abs(r["task_passed"] - rows["float"]["task_passed"]) for r in rows.values())
    assert all(r["task_change_pts"] == 100 * (r["task_score"] - rows["float"]["task_score"]) for r in rows.values())
    assert "batch/s" in text and "task" in text


def _table(tmp_path, folder, settings, *extra):
    out = tmp_path / f"q{len(list(tmp_path.iterdir()))}.json"
    assert main(["quant", "--model", str(folder), "--settings", ",".join(settings), "--prompt-len", "4",
                 "--output-len", "4", "--prefill-len", "16", "--repeats", "1", "--quality-windows", "1",
                 "--quality-len", "64", "--throughput-requests", "2", "--tasks", "code", "--task-limit", "2",
                 "--no-roofs", "--quiet", "--json", str(out), *extra]) == 0
    report = json.loads(out.read_text())
    return report["settings"], {r["setting"]: r for r in report["rows"]}


def test_sequential_mode_measures_the_same_models_as_interleaved(tmp_path, monkeypatch, capsys, one_thread):
    """One copy at a time (for models whose copies do not all fit) changes when things run, not what is measured."""
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    settings = ["float", "int4", "w8a8", "kv-int8"]
    s_on, seq = _table(tmp_path, folder, settings, "--sequential", "on")
    s_off, both = _table(tmp_path, folder, settings, "--sequential", "off")
    assert s_on["sequential"] is True and s_off["sequential"] is False and s_on["dtype"] == "float32"
    assert list(seq) == settings
    for name in settings:
        for key in ("weight_bytes_per_token", "model_bytes", "kv_pool_bytes", "perplexity", "top1_agreement",
                    "task_passed", "task_change_pts"):
            assert seq[name][key] == both[name][key], (name, key)
        assert len(seq[name]["tok_s"]) == 1 and seq[name]["throughput_tok_s"] > 0


def test_bf16_float_row_and_code_calibration_reach_the_settings(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    s, rows = _table(tmp_path, folder, ["float", "gptq", "gptq+calib-code"], "--dtype", "bfloat16")
    assert s["dtype"] == "bfloat16"
    f32_settings, f32 = _table(tmp_path, folder, ["float"])
    assert rows["float"]["model_bytes"] < f32["float"]["model_bytes"]  # two bytes per weight instead of four
    # the code-calibrated GPTQ is a different model from the prose-calibrated one
    assert rows["gptq+calib-code"]["perplexity"] != rows["gptq"]["perplexity"]


def test_a_dtype_part_runs_the_float_model_in_that_dtype_in_the_same_table(tmp_path, monkeypatch, one_thread):
    """'bf16' beside 'float' (float32): the best float dtype measured in the same run as the int8 GEMMs."""
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    _, rows = _table(tmp_path, folder, ["float", "bf16", "fp32", "w8a8+bf16"])
    assert rows["bf16"]["model_bytes"] * 2 == rows["float"]["model_bytes"]  # every weight two bytes, not four
    assert rows["bf16"]["kv_bytes_per_token"] * 2 == rows["float"]["kv_bytes_per_token"]  # its KV cache too
    assert rows["fp32"]["model_bytes"] == rows["float"]["model_bytes"]  # already float32: no copy, same model
    assert rows["fp32"]["perplexity"] == rows["float"]["perplexity"]
    assert rows["bf16"]["perplexity"] != rows["float"]["perplexity"]  # rounding to bf16 changes the scores
    assert rows["w8a8+bf16"]["model_bytes"] < rows["bf16"]["model_bytes"]


def test_sequential_when_one_copy_per_setting_does_not_fit(tmp_path):
    from minillm.bench.quant import needs_sequential
    from minillm.loader import load_model
    from minillm.quant.footprint import model_bytes

    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    loaded = load_model(str(folder))
    size = model_bytes(loaded.model)
    three = ["float", "int8", "int4", "kv-int8", "gptq", "fp32"]  # float, fp32, kv-int8 share the loaded model
    assert not needs_sequential(loaded, three, available_bytes=6 * size + 2)
    assert needs_sequential(loaded, three, available_bytes=6 * size - 2)


def test_task_flips_count_the_items_whose_verdict_changed():
    import minillm.bench.quant as q
    from minillm.bench.quant import QuantSubjectRow

    base = QuantSubjectRow("float", 1, 1, 1.0, None, 0.0, task_verdicts=[True, False, True, False])
    other = QuantSubjectRow("int4", 1, 1, 1.0, None, 0.0, task_verdicts=[False, True, True, False])
    for r in (base, other):
        r.task_passed, r.task_total = sum(r.task_verdicts), len(r.task_verdicts)
    q._compare_tasks([base, other])
    assert other.task_change_pts == 0 and other.task_flips == 2 and base.task_flips == 0
