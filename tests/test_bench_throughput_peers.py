"""bench throughput: a static-batching peer swept over batch sizes is judged by its best one."""
from __future__ import annotations

import argparse

import pytest

from minillm.bench.subject import BatchRun
from minillm.bench.throughput import SubjectThroughput, summarize_throughput


def served(tok_s: float) -> SubjectThroughput:
    return SubjectThroughput(runs=[BatchRun(wall_s=100.0 / tok_s, prompt_tokens=50, output_tokens=100,
                                            generated_tokens=100)])


def test_the_transformers_target_compares_with_its_best_batch_size():
    runs = {"minillm": served(40.0), "transformers-b8": served(10.0), "transformers-b32": served(20.0),
            "transformers-b64": served(16.0)}
    out = summarize_throughput(runs)
    target = next(t for t in out["targets"] if t.name == "throughput_vs_transformers")
    assert target.value == pytest.approx(2.0)  # 40 / 20, the best sweep point, not 40 / 10
    assert out["ratios"]["transformers-b8"]["output_tok_s"] == pytest.approx(4.0)


def test_one_batch_size_keeps_the_plain_name():
    out = summarize_throughput({"minillm": served(30.0), "transformers": served(10.0)})
    assert next(t for t in out["targets"] if t.name == "throughput_vs_transformers").value == pytest.approx(3.0)


def test_the_cli_takes_several_batch_sizes():
    from minillm.bench.cli import build_parser

    args = build_parser().parse_args(["throughput", "--compare", "transformers", "--hf-batch-size", "8", "16", "64"])
    assert args.hf_batch_size == [8, 16, 64]
    assert build_parser().parse_args(["throughput"]).hf_batch_size == [32]
