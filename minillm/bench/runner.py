"""Measure, summarize and assemble a report, given subjects that are already loaded.

The CLI loads models and calls these; tests call them with a tiny random model.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from minillm.bench.latency import measure_latency, summarize_latency
from minillm.roofline.machine_state import MachineState, probe_machine_state, settle
from minillm.bench.report import build_report
from minillm.bench.subject import Subject
from minillm.bench.throughput import measure_throughput, summarize_throughput
from minillm.bench.workload import LatencyWorkload, ThroughputWorkload
from minillm.config import ModelConfig
from minillm.roofline.machine import machine_info
from minillm.roofline.roofs import Roofs
from minillm.roofline.same_run import SameRunRoof, bandwidth_probe, matmul_probe

Log = Callable[[str], None]


def report_context(roofs: Roofs | None, device: str, same_run: SameRunRoof | None = None) -> dict[str, Any]:
    """The fields every bench report carries about where it ran: the machine, its measured roofs (None
    when not measured) and the roof measured again during this run."""
    return {"machine": machine_info(device).to_dict(), "roofs": roofs.to_dict() if roofs else None,
            "same_run_roof": same_run.to_dict() if same_run else None}


def latency_report(
    subjects: Sequence[Subject], cfg: ModelConfig, dtype: torch.dtype, workload: LatencyWorkload,
    roofs: Roofs | None, settings: dict[str, Any], repeats: int = 5, prefill_repeats: int = 3,
    warmup: bool = True, device: str = "cpu", log: Log = lambda s: None,
    settle: Callable[[], MachineState] = settle,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(JSON report, summary with live objects for printing)."""
    same_run = bandwidth_probe(roofs, device) if roofs else None  # the roof again, between the repeats
    before = probe_machine_state()
    runs = measure_latency(subjects, workload, cfg.vocab_size, repeats, prefill_repeats, warmup, log, settle,
                           between_repeats=same_run.measure if same_run else None)
    after = probe_machine_state()
    summary = summarize_latency(runs, workload, cfg, dtype, roofs.bandwidth_bytes_per_s if roofs else None,
                                quantized=settings.get("quantization") is not None,
                                compiled=bool(settings.get("compile")),
                                same_run_roofs=same_run.around_repeats(repeats) if same_run else None)
    report = build_report(
        "latency", **report_context(roofs, device, same_run),
        machine_state={"before": before.to_dict(), "after": after.to_dict()},
        settings={**settings, "dtype": str(dtype).removeprefix("torch."), "repeats": repeats,
                  "prefill_repeats": prefill_repeats, "subjects": [s.name for s in subjects]},
        workload=workload.to_dict(), **summary,
    )
    summary["same_run_roof"] = same_run  # for printing (the report holds its dict)
    return report, summary


def throughput_report(
    subjects: Sequence[Subject], cfg: ModelConfig, dtype: torch.dtype, workload: ThroughputWorkload,
    roofs: Roofs | None, settings: dict[str, Any], repeats: int = 1, warmup: bool = True,
    device: str = "cpu", log: Log = lambda s: None, settle: Callable[[], MachineState] = settle,
) -> tuple[dict[str, Any], dict[str, Any]]:
    name = str(dtype).removeprefix("torch.")
    same_run = matmul_probe(roofs, name, device) if roofs else None  # the roof again, between the repeats
    before = probe_machine_state()
    runs = measure_throughput(subjects, workload, cfg.vocab_size, repeats, warmup, log, settle,
                              between_repeats=same_run.measure if same_run else None)
    after = probe_machine_state()
    summary = summarize_throughput(runs, compute_roof=roofs.flops_per_s(name) if roofs and name in roofs.matmul else None,
                                   same_run_roofs=same_run.around_repeats(repeats) if same_run else None)
    report = build_report(
        "throughput", **report_context(roofs, device, same_run),
        machine_state={"before": before.to_dict(), "after": after.to_dict()},
        settings={**settings, "dtype": str(dtype).removeprefix("torch."), "repeats": repeats,
                  "subjects": [s.name for s in subjects]},
        workload=workload.to_dict(), **summary,
    )
    summary["same_run_roof"] = same_run  # for printing (the report holds its dict)
    return report, summary
