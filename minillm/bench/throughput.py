"""`minillm bench throughput`: a workload of many requests, all arriving at once.

Output tok/s counts only the tokens the requests asked for (a static-batching
peer computes more: the padding up to its batch's longest request; that waste
is reported as generated / requested). Total tok/s adds the prompt tokens.
TTFT and TPOT percentiles pool every request of every repeat.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from minillm.roofline.machine_state import MachineState, settle
from minillm.bench.stats import figure, paired_ratio, percentiles, ratio
from minillm.bench.subject import BatchRun, Subject
from minillm.bench.targets import (THROUGHPUT_COMPUTE_ROOF, THROUGHPUT_VS_LLAMA_CPP, THROUGHPUT_VS_TRANSFORMERS,
                                   Target, target)
from minillm.bench.workload import ThroughputWorkload

Log = Callable[[str], None]


@dataclass
class SubjectThroughput:
    runs: list[BatchRun] = field(default_factory=list)
    stall: list[float] = field(default_factory=list)  # machine-state probe before each repeat

    def figures(self) -> dict[str, Any]:
        rs = self.runs
        ttft = [t for r in rs for t in r.ttft_s]
        tpot = [t for r in rs for t in r.tpot_s]
        counted = rs and all(r.flops is not None for r in rs)
        return {
            # only for a subject that counts its FLOPs (minillm's trace); peers do the same work or more
            "achieved_flops_per_s": figure("FLOP/s", [r.flops / r.wall_s for r in rs]) if counted else None,
            "output_tok_s": figure("tok/s", [r.output_tokens / r.wall_s for r in rs]),
            "total_tok_s": figure("tok/s", [(r.prompt_tokens + r.output_tokens) / r.wall_s for r in rs]),
            "wall_s": figure("s", [r.wall_s for r in rs]),
            "requests_per_s": figure("req/s", [len(r.ttft_s) / r.wall_s for r in rs]),
            "ttft_s": percentiles(ttft),
            "tpot_s": percentiles(tpot),
            "prompt_tokens": rs[0].prompt_tokens if rs else 0,
            "output_tokens": rs[0].output_tokens if rs else 0,
            "generated_tokens": rs[0].generated_tokens if rs else 0,
            "generated_per_requested": ratio(rs[0].generated_tokens, rs[0].output_tokens) if rs else None,
            "num_steps": [r.num_steps for r in rs],
            "stall_ratio_before_repeat": self.stall,
        }


def measure_throughput(
    subjects: Sequence[Subject], workload: ThroughputWorkload, vocab_size: int,
    repeats: int = 1, warmup: bool = True, log: Log = lambda s: None,
    settle: Callable[[], MachineState] = settle, between_repeats: Callable[[], object] | None = None,
) -> dict[str, SubjectThroughput]:
    """between_repeats (a same-run roof probe) runs before each repeat and after the last."""
    prompts, outs = workload.requests(vocab_size)
    runs = {s.name: SubjectThroughput() for s in subjects}
    if warmup:
        for s in subjects:
            log(f"warm-up {s.name}")
            s.serve(prompts[:4], [min(8, n) for n in outs[:4]])
    for r in range(repeats):
        if between_repeats is not None:
            between_repeats()
        for s in subjects if r % 2 == 0 else list(reversed(subjects)):
            stall = settle().stall_ratio
            run = s.serve(prompts, outs)
            runs[s.name].runs.append(run)
            runs[s.name].stall.append(stall)
            log(f"serve   {s.name:12s} repeat {r}: {run.output_tokens / run.wall_s:8.1f} output tok/s, "
                f"{run.wall_s:6.1f} s  (stall {stall:.3g})")
    if between_repeats is not None and repeats:
        between_repeats()
    return runs


def summarize_throughput(runs: dict[str, SubjectThroughput], baseline: str = "minillm",
                         compute_roof: float | None = None,
                         same_run_roofs: Sequence[float] | None = None) -> dict[str, Any]:
    """Figures, ratios over each peer, and the targets; compute_roof (FLOP/s of the dtype used, cached)
    turns the baseline's counted FLOP/s into a fraction of the machine's measured matmul roof, and
    same_run_roofs (the GEMM probed around each repeat of this run, SameRunRoof.around_repeats) into
    the fraction the target uses when given: the median over repeats of each against its own roof."""
    figures = {name: sub.figures() for name, sub in runs.items()}
    base = figures.get(baseline)
    achieved = base.get("achieved_flops_per_s") if base else None
    roof_fraction = achieved.median / compute_roof if achieved is not None and compute_roof else None
    same_run = None
    if achieved is not None and same_run_roofs and len(same_run_roofs) == len(achieved.values):
        same_run = statistics.median(a / roof for a, roof in zip(achieved.values, same_run_roofs))
    if base is not None:
        base["compute_roof_fraction"] = roof_fraction
        base["same_run_compute_roof_fraction"] = same_run
    ratios = {
        name: {"output_tok_s": ratio(base["output_tok_s"].median, f["output_tok_s"].median),
               "total_tok_s": ratio(base["total_tok_s"].median, f["total_tok_s"].median),
               "output_tok_s_paired": paired_ratio(base["output_tok_s"].values, f["output_tok_s"].values)}
        for name, f in figures.items() if name != baseline and base is not None
    }
    # llama.cpp may run twice (repack on / off): the target is against its faster run
    vs_llama = [r["output_tok_s"] for name, r in ratios.items() if name.startswith("llama.cpp") and r["output_tok_s"]]
    # transformers may run at several static batch sizes (transformers-bN): the target is against its best
    vs_hf = [r["output_tok_s"] for name, r in ratios.items() if name.startswith("transformers") and r["output_tok_s"]]
    targets: list[Target] = [target(THROUGHPUT_VS_TRANSFORMERS, min(vs_hf) if vs_hf else None),
                             target(THROUGHPUT_VS_LLAMA_CPP, min(vs_llama) if vs_llama else None),
                             target(THROUGHPUT_COMPUTE_ROOF, same_run if same_run is not None else roof_fraction)]
    return {"figures": figures, "ratios": ratios, "targets": targets}
