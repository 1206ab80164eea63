"""A mixed workload replayed on one LLMEngine in this process, arrivals on the engine's step clock.

`bench serve --workload mixed` (serve_mixed.py) sends the workload over HTTP
with wall-clock arrivals. On a busy machine those arrivals land on different
engine steps from run to run, so two policies never see the same queue. Here
the same MixedWorkload generator is used, but its offsets are read in engine
steps: a request with offset o is added just before step floor(o) (at once if
the engine ran dry before then). Each policy then sees the same arrivals in
the same steps, the queues it builds are its own doing, and the step counts
(TTFT in steps) are exact; the wall-clock TTFT / e2e come from the engine's
own request metrics, so they include the real cost of every step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from minillm.bench.serve_mixed import CLASSES, MixedWorkload
from minillm.bench.stats import percentiles
from minillm.engine.llm_engine import LLMEngine
from minillm.sampling_params import SamplingParams


@dataclass(frozen=True)
class StepArrival:
    request_id: str
    step: int  # added just before this engine step (counted from the replay's first step)
    prompt: list[int]
    max_tokens: int
    cls: str  # "short" | "long"
    priority: int


@dataclass(frozen=True)
class ReplayRecord:
    request_id: str
    cls: str
    arrival_step: int  # the first step the request could be scheduled in
    first_token_step: int  # the step that produced its first token
    finish_step: int
    ttft_s: float  # from the engine's request metrics (perf_counter)
    e2e_s: float
    token_ids: tuple[int, ...]

    @property
    def ttft_steps(self) -> int:
        """Steps the request lived through up to and including its first token (1 = served at once)."""
        return self.first_token_step - self.arrival_step + 1

    @property
    def e2e_steps(self) -> int:
        return self.finish_step - self.arrival_step + 1


def step_arrivals(workload: MixedWorkload, vocab_size: int) -> list[StepArrival]:
    """workload.requests() with each send offset read as engine steps (rates: requests per step)."""
    out: list[StepArrival] = []
    seen: dict[str, int] = {}
    for t, prompt, max_tokens, cls, prio in workload.requests(vocab_size):
        seen[cls] = seen.get(cls, -1) + 1  # numbered within the class, in send order: short-0, long-0, ...
        out.append(StepArrival(f"{cls}-{seen[cls]}", int(math.floor(t)), prompt, max_tokens, cls, prio))
    return out


def replay(engine: LLMEngine, arrivals: list[StepArrival]) -> list[ReplayRecord]:
    """Run the arrivals through `engine` until every request finished; one record per request, by id."""
    engine.executor.attach()  # this engine's KV pool, in case another engine used the model since
    pending = sorted(arrivals, key=lambda a: a.step)  # stable: the generator's order within a step
    first = len(engine.trace)
    arrived: dict[str, int] = {}
    first_token: dict[str, int] = {}
    done: dict[str, Any] = {}
    cls = {a.request_id: a.cls for a in arrivals}
    k = 0
    while k < len(pending) or engine.has_unfinished_requests():
        step = len(engine.trace) - first
        # an idle engine jumps to the next arrival: the clock counts steps the engine ran
        while k < len(pending) and (pending[k].step <= step or not engine.has_unfinished_requests()):
            a = pending[k]
            engine.add_request(a.request_id, a.prompt, SamplingParams(temperature=0.0, max_tokens=a.max_tokens,
                                                                      ignore_eos=True), priority=a.priority)
            arrived[a.request_id] = step
            k += 1
        for out in engine.step():
            if out.outputs and out.outputs[0].token_ids:
                first_token.setdefault(out.request_id, step)
            if out.finished:
                done[out.request_id] = (step, out)
    records = []
    for rid, (finish, out) in sorted(done.items()):
        m = out.metrics
        records.append(ReplayRecord(rid, cls[rid], arrived[rid], first_token[rid], finish, m.ttft, m.e2e_latency,
                                    tuple(out.outputs[0].token_ids)))
    return records


def class_percentiles(records: list[ReplayRecord]) -> dict[str, dict[str, dict[str, float]]]:
    """{class: {"ttft_s" | "e2e_s" | "ttft_steps" | "e2e_steps": {"p50", "p90", "p99"}}}."""
    out = {}
    for c in CLASSES:
        rs = [r for r in records if r.cls == c]
        out[c] = {"ttft_s": percentiles([r.ttft_s for r in rs]), "e2e_s": percentiles([r.e2e_s for r in rs]),
                  "ttft_steps": percentiles([float(r.ttft_steps) for r in rs]),
                  "e2e_steps": percentiles([float(r.e2e_steps) for r in rs])}
    return out
