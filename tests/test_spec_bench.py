"""`minillm bench spec` on the default model, tiny settings: the report's shape, no timing claims."""
from __future__ import annotations

import json

import pytest

from minillm.bench import spec as sb
from minillm.bench.report import build_report

pytestmark = [pytest.mark.default_model, pytest.mark.slow]


def test_spec_bench_report(default_model):
    m = default_model
    engines = sb.build_engines(m.model, m.tokenizer, m.eos_token_ids, ["none", "ngram", "hydra"], 16 << 20)
    wl = sb.SpecWorkload("repeat", sb.REPEAT[:1], output_len=8)
    prompts = wl.token_ids(m.tokenizer)
    batch1 = {"repeat": sb.measure_batch1(engines, wl, prompts, ks=[3])}
    scaling = {"repeat": sb.measure_batch_scaling(engines, wl, prompts, [1, 2], k=3)}
    summary = sb.summarize_spec(batch1, scaling)
    rows = {(r["proposer"], r["k"]): r for r in summary["batch1"]}
    assert set(rows) == {("none", 0), ("ngram", 3)}  # the shipped 2 Hydra heads cannot guess 3: left out
    assert all(r["same_tokens_as_first_config"] for r in rows.values())  # greedy: speculation changes nothing
    assert rows[("none", 0)]["speedup"] == 1.0 and rows[("none", 0)]["proposed"] == 0
    ng = rows[("ngram", 3)]
    assert ng["proposed"] > 0 and 0.0 <= ng["acceptance_rate"] <= 1.0
    assert 1.0 <= ng["tokens_per_verify"] <= 4.0
    assert summary["best"]["proposer"] == "ngram"
    assert set(summary["batch_scaling_speedup"]["repeat"]["ngram"]) == {1, 2}
    assert "hydra" not in summary["batch_scaling_speedup"]["repeat"]
    report = build_report("spec", workload={"repeat": wl.to_dict()}, **summary)
    json.dumps(report)  # plain JSON all the way down
    assert report["targets"][0]["name"] == "spec_batch1_speedup"
    assert "tok/verify" in sb.format_spec(summary)
    for e in engines.values():
        assert e.block_manager.num_free_blocks == e.block_manager.num_blocks


def test_unknown_proposer_fails_before_loading_the_model():
    from minillm.bench.cli import main

    with pytest.raises(ValueError, match="unknown proposer"):
        main(["spec", "--proposers", "lookahead", "--model", "/nonexistent.gguf"])
    with pytest.raises(ValueError, match="eagle:FILE"):  # an EAGLE layer must be named: none ships
        main(["spec", "--proposers", "eagle", "--model", "/nonexistent.gguf"])


def test_a_draft_model_proposer_can_cut_its_vocabulary():
    from minillm.bench.spec import Proposer

    assert Proposer("draft:qwen2.5-coder-0.5b").speculative == {
        "method": "draft", "model": "qwen2.5-coder-0.5b", "num_tokens": 1}
    assert Proposer("draft:qwen2.5-coder-0.5b@32768").speculative == {
        "method": "draft", "model": "qwen2.5-coder-0.5b", "num_tokens": 1, "draft_vocab": 32768}
    assert Proposer("draft:/models/a@b.gguf").speculative["model"] == "/models/a@b.gguf"  # not a number: a path
    assert Proposer("draft:qwen2.5-coder-0.5b@32768").is_draft_model
    assert Proposer("draft:qwen2.5-coder-0.5b@32768+compile").speculative == {
        "method": "draft", "model": "qwen2.5-coder-0.5b", "num_tokens": 1, "draft_vocab": 32768, "compile": True}
    assert Proposer("medusa@32768").speculative == {"method": "medusa", "heads": None, "num_tokens": 1,
                                                    "draft_vocab": 32768}
    assert Proposer("medusa:/h/x.safetensors@8").speculative["heads"] == "/h/x.safetensors"
    assert Proposer("medusa:/h/x.safetensors").speculative == {"method": "medusa", "heads": "/h/x.safetensors",
                                                               "num_tokens": 1}
    assert Proposer("draft:qwen2.5-coder-0.5b+compile").speculative == {
        "method": "draft", "model": "qwen2.5-coder-0.5b", "num_tokens": 1, "compile": True}
    # prompt lookup first (spec_decode/lookup_first.py), in either order with +compile
    for name in ("draft:qwen2.5-coder-0.5b@32768+compile+lookup", "draft:qwen2.5-coder-0.5b@32768+lookup+compile"):
        assert Proposer(name).speculative == {"method": "draft", "model": "qwen2.5-coder-0.5b", "num_tokens": 1,
                                              "draft_vocab": 32768, "compile": True, "prompt_lookup_min": 3}


def test_hydra_proposers_parse_like_medusas():
    from minillm.bench.spec import Proposer

    assert Proposer("hydra").speculative == {"method": "hydra", "heads": None, "num_tokens": 1}
    assert Proposer("hydra@8192").speculative == {"method": "hydra", "heads": None, "num_tokens": 1, "draft_vocab": 8192}
    assert Proposer("hydra:/h/x.safetensors").speculative["heads"] == "/h/x.safetensors"
    assert Proposer("hydra-tree:2x1").speculative == {"method": "hydra", "tree": [2, 1]}
    assert Proposer("hydra-tree:2x1@4096").speculative == {"method": "hydra", "tree": [2, 1], "draft_vocab": 4096}
    assert Proposer("medusa-tree:3x2").speculative == {"method": "medusa", "tree": [3, 2]}
    assert Proposer("hydra-tree:2x1").fixed_k == 2
    # a tree as rank paths: nodes by slashes, ranks by dashes (head 1's top-2, head 2's top-1 under the first)
    assert Proposer("hydra-tree:0/1/0-0@4096").speculative == {"method": "hydra", "tree": [[0], [1], [0, 0]],
                                                                "draft_vocab": 4096}
    assert Proposer("hydra-tree:0/1/0-0").fixed_k == 2 and Proposer("hydra-tree:0/1").fixed_k == 1
    with pytest.raises(ValueError, match="unknown proposer"):
        Proposer("hydra-tree:0/x").speculative
    assert all(Proposer(n).is_medusa for n in ("hydra", "hydra@8192", "hydra-tree:2x1", "medusa"))
    assert not Proposer("draft:x").is_medusa


def test_medusa_on_chat_has_its_own_target_from_its_best_chat_cell():
    from minillm.bench.stats import figure

    def cell(name, k, tok_s, acc=None):
        return {"proposer": name, "k": k, "decode_tok_per_s": figure("tok/s", [tok_s]), "acceptance_rate": acc,
                "step_ms": 1000 / tok_s}

    batch1 = {"chat": {("none", 0): cell("none", 0, 40.0), ("medusa", 1): cell("medusa", 1, 48.0, 0.4),
                       ("medusa", 3): cell("medusa", 3, 56.0, 0.3), ("ngram", 3): cell("ngram", 3, 80.0, 0.9)},
              "code": {("none", 0): cell("none", 0, 40.0), ("medusa", 1): cell("medusa", 1, 100.0, 0.9),
                       ("medusa", 3): cell("medusa", 3, 40.0, 0.1), ("ngram", 3): cell("ngram", 3, 40.0, 0.1)}}
    summary = sb.summarize_spec(batch1, {})
    best = summary["best_medusa_on_chat"]
    assert (best["proposer"], best["k"]) == ("medusa", 3) and best["speedup"] == pytest.approx(1.4)  # not ngram's x2
    medusa_target = next(t for t in summary["targets"] if t.name == "spec_medusa_chat_speedup")
    assert medusa_target.value == pytest.approx(1.4) and medusa_target.passed  # >= 1.3
    no_medusa = sb.summarize_spec({"chat": {k: v for k, v in batch1["chat"].items() if k[0] != "medusa"}}, {})
    assert no_medusa["best_medusa_on_chat"] is None
    assert all(t.name != "spec_medusa_chat_speedup" for t in no_medusa["targets"])
