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
    assert build_parser().parse_args(["throughput"]).hf_batch_size == [8, 16, 32, 64]  # swept by default (issue 16)


def test_the_compute_roof_fraction_comes_from_the_counted_flops():
    """Issue 20: minillm's counted FLOPs over the wall time against the dtype's matmul roof (>= 0.6);
    a peer that counts none gets no figure."""
    base = SubjectThroughput(runs=[BatchRun(wall_s=2.0, prompt_tokens=50, output_tokens=100, generated_tokens=100,
                                            flops=4e11)])  # 200 GFLOP/s
    out = summarize_throughput({"minillm": base, "transformers": served(10.0)}, compute_roof=5e11)
    t = next(t for t in out["targets"] if t.name == "throughput_compute_roof_fraction")
    assert t.value == pytest.approx(0.4) and t.passed is False
    assert out["figures"]["minillm"]["achieved_flops_per_s"].median == pytest.approx(2e11)
    assert out["figures"]["transformers"]["achieved_flops_per_s"] is None
    out = summarize_throughput({"minillm": base}, compute_roof=3e11)
    assert next(t for t in out["targets"] if t.name == "throughput_compute_roof_fraction").passed is True
    no_roof = summarize_throughput({"minillm": base})
    assert next(t for t in no_roof["targets"] if t.name == "throughput_compute_roof_fraction").value is None
