"""`minillm eval ppl`: chunked paged scoring equals one dense pass; settings parse; the default model's numbers."""
from __future__ import annotations

import json
import math

import pytest
import torch

from minillm.eval import corpus_text, score_windows, windows
from minillm.eval.ppl import EvalConfig, parse_setting, run_eval, targets
from minillm.models.standalone import forward_logits
from tests.helpers.engine_utils import tiny_model


def test_chunked_paged_scores_equal_one_dense_forward():
    model = tiny_model(layers=2)
    wins = torch.randint(0, 97, (3, 21), generator=torch.Generator().manual_seed(0))
    s = score_windows(model, wins, chunk_size=5, block_size=4)
    assert s.nll.shape == (3, 20) and s.num_tokens == 60
    for i in range(3):
        logits = forward_logits(model, wins[i].tolist(), block_size=32)
        logp = torch.log_softmax(logits[:-1].double(), -1)
        want = -logp.gather(-1, wins[i, 1:, None]).squeeze(-1)
        torch.testing.assert_close(s.nll[i], want, atol=1e-4, rtol=0)
        assert torch.equal(s.top1[i], logits[:-1].argmax(-1))
    assert math.isclose(s.perplexity, math.exp(s.nll.mean().item()))


def test_text_splits_are_disjoint_and_windows_are_checked():
    ev, cal = corpus_text("eval"), corpus_text("calib")
    assert len(ev) > 100_000 and len(cal) > 100_000 and ev[:2000] not in cal
    with pytest.raises(ValueError, match="unknown text split"):
        corpus_text("test")
    with pytest.raises(ValueError, match="at least 8 tokens"):
        windows([1, 2, 3], 8)
    assert windows(list(range(20)), 8).tolist() == [list(range(8)), list(range(8, 16))]


def test_settings_parse_and_bad_names_fail():
    assert parse_setting("int4+kv-int8") == parse_setting("int4+kv-int8")
    s = parse_setting("int4-awq+kv-fp8")
    assert (s.quantization, s.kv_cache_dtype) == ("int4-awq", "fp8")
    assert parse_setting("float").quantization is None
    with pytest.raises(ValueError, match="unknown part 'int5'"):
        parse_setting("int5")
    with pytest.raises(ValueError, match="two weight methods"):
        parse_setting("int8+int4")
    # a float dtype part: the copy runs in that dtype (a same-run float32 vs bfloat16 comparison)
    assert parse_setting("bf16").dtype == "bf16" and parse_setting("bf16").quantization is None
    assert parse_setting("w8a8+fp32").torch_dtype == torch.float32 and parse_setting("int4").dtype is None
    with pytest.raises(ValueError, match="two float dtypes"):
        parse_setting("bf16+fp32")


@pytest.mark.slow
def test_eval_on_the_default_model(default_model, tmp_path):
    cfg = EvalConfig(context_len=64, max_windows=2, chunk_size=32, settings=("float", "int8", "kv-int8", "kv-bad"))
    rows, workload = run_eval(cfg, default_model, log=lambda _: None)
    by = {r.setting: r for r in rows}
    assert workload["scored_tokens"] == 2 * 63
    f, q8, kv = by["float"], by["int8"], by["kv-int8"]
    assert f.ppl_change_pct == 0 and f.top1_agreement == 1.0 and 5 < f.perplexity < 100
    # measured: int8 weights +0.3% ppl (128 x 4 tokens); the bound leaves room for this tiny slice
    assert abs(q8.ppl_change_pct) < 3 and q8.top1_agreement > 0.9
    assert q8.weight_bytes_per_token < 0.45 * f.weight_bytes_per_token
    assert kv.kv_bytes_per_token < 0.3 * f.kv_bytes_per_token and abs(kv.ppl_change_pct) < 3
    assert by["kv-bad"].error is not None and "kv" in by["kv-bad"].error.lower()  # an error row, not a crash
    t = {c["name"]: c for c in targets(rows)}
    assert t["int4 AWQ raises perplexity less than int4 RTN"]["passed"] is None  # not run
    json.dumps([r.__dict__ for r in rows])  # the rows are JSON-ready


def test_cli_refuses_bad_settings_before_loading_anything():
    from minillm.cli import main

    with pytest.raises(SystemExit, match="unknown part 'int5'"):
        main(["eval", "ppl", "--settings", "float,int5"])
    with pytest.raises(SystemExit, match="unknown part 'kv'"):
        main(["bench", "quant", "--settings", "int4+kv", "--no-roofs"])
