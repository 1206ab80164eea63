"""The calibration-domain experiment (issue 17): a code text beside the prose one, a calibration
option that reaches the quantizers, and the table that compares prose- and code-calibrated copies."""
from __future__ import annotations

import pytest
import torch

from minillm.eval.calibration_domain import DomainRow, format_table, gaps, run_calibration_domain, schemes
from minillm.eval.ppl import parse_setting
from minillm.eval.text import code_excerpt, corpus_text
from minillm.quant.methods import check_llm_options


def test_code_text_is_python_and_its_splits_are_disjoint():
    ev, cal = corpus_text("eval", "code"), corpus_text("calib", "code")
    assert len(ev) > 100_000 and len(cal) > 100_000
    assert ev[:3000] not in cal and cal[:3000] not in ev
    assert ev.count("def ") > 300 and cal.count("def ") > 300  # function bodies, not licence text
    compile(code_excerpt("'''doc'''\nimport os\n\ndef f(x):\n    return x\n"), "<x>", "exec")
    assert code_excerpt("'''doc'''\nimport os\n\ndef f(x):\n    return x\n").startswith("def f")
    with pytest.raises(ValueError, match="unknown text domain"):
        corpus_text("eval", "poetry")


def test_calibration_parts_parse_and_bad_ones_fail():
    s = parse_setting("gptq+calib-code+kv-int8")
    assert (s.quantization, s.calibration, s.kv_cache_dtype) == ("gptq", "code", "int8")
    assert parse_setting("int4-awq").calibration == "prose"
    with pytest.raises(ValueError, match="unknown calibration text"):
        parse_setting("gptq+calib-poetry")
    with pytest.raises(ValueError, match="calibrate, not int8"):
        parse_setting("int8+calib-code")
    with pytest.raises(ValueError, match="quantization_calibration"):
        check_llm_options("gptq", None, "poetry")
    assert schemes(("gptq",)) == ("float", "gptq+calib-prose", "gptq+calib-code")


def test_gaps_and_table_from_rows():
    rows = [DomainRow("float", "-", 0.5, 26, 52, {"prose": 0.0, "code": 0.0}, {"prose": 1.0, "code": 1.0}),
            DomainRow("gptq", "prose", 0.33, 17, 52, {"prose": 1.0, "code": 4.0}, {"prose": 0.9, "code": 0.8}),
            DomainRow("gptq", "code", 0.40, 21, 52, {"prose": 2.5, "code": 1.5}, {"prose": 0.85, "code": 0.9})]
    (g,) = gaps(rows)
    assert g == {"method": "gptq", "pass_at_1_pts": 7.0, "ppl_change_pts_prose": 1.5, "ppl_change_pts_code": -2.5}
    assert "gptq" in format_table(rows) and "21/52" in format_table(rows)
    with pytest.raises(ValueError, match="calibrating ones"):
        run_calibration_domain(None, ("int8",))


@pytest.mark.slow
def test_the_calibration_text_reaches_the_quantizer_and_the_table_runs(default_model):
    """On the default model, w8a8 (SmoothQuant scales from the calibration activations) calibrated on
    prose and on code gives different weights, and both rows carry scores on both texts."""
    from minillm.loader.default import default_model_path

    rows, task_rows, workload = run_calibration_domain(default_model_path(), ("w8a8",), limit=2, windows=1,
                                                       context_len=64, log=lambda _: None)
    assert [(r.method, r.calibration) for r in rows] == [("float", "-"), ("w8a8", "prose"), ("w8a8", "code")]
    assert all(r.error is None for r in rows), [r.error for r in rows]
    f, p, c = rows
    assert f.ppl_change_pct == {"prose": 0.0, "code": 0.0} and f.top1_agreement == {"prose": 1.0, "code": 1.0}
    for r in (p, c):
        assert set(r.ppl_change_pct) == {"prose", "code"} and all(abs(v) < 20 for v in r.ppl_change_pct.values())
    # different calibration text -> different smoothing -> different scores somewhere
    assert p.ppl_change_pct != c.ppl_change_pct or p.top1_agreement != c.top1_agreement
    assert workload["calibration_tokens"] == {"w8a8": "16x128"}
    assert all("top1" not in sc for t in task_rows for sc in t.text_scores.values())
