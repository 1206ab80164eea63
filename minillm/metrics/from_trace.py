"""Serving metrics computed from the step trace alone (never from engine internals).

A token's time is the end of the step that produced it.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from minillm.engine.trace import StepTrace
from minillm.engine import outputs as _latency  # the one definition of TTFT, TPOT, e2e, queue time
from minillm.roofline.steps import RoofPair, roofline_summary, trace_roofline


@dataclass
class RequestTimeline:
    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    token_times: list[float] = field(default_factory=list)  # of the first completion (seq index 0)
    first_scheduled_time: float | None = None
    finish_time: float | None = None
    finish_reason: str | None = None
    num_prefix_hit_tokens: int = 0
    num_preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        """Time to first token (see minillm.engine.outputs.ttft)."""
        return _latency.ttft(self.arrival_time, self.token_times[0] if self.token_times else None)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (see minillm.engine.outputs.tpot)."""
        tt = self.token_times
        return _latency.tpot(tt[0] if tt else None, tt[-1] if tt else None, len(tt))

    @property
    def inter_token_latencies(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def e2e_latency(self) -> float | None:
        return _latency.e2e_latency(self.arrival_time, self.finish_time)

    @property
    def queue_time(self) -> float | None:
        return _latency.queue_time(self.arrival_time, self.first_scheduled_time)


def request_timelines(trace: list[StepTrace]) -> dict[str, RequestTimeline]:
    lines: dict[str, RequestTimeline] = {}
    first_seq: dict[int, str] = {}  # seq id of each request's first completion -> request id
    for rec in trace:
        end = rec.start_time + rec.duration_s
        for a in rec.arrivals:
            lines[a.request_id] = RequestTimeline(a.request_id, a.arrival_time, a.num_prompt_tokens)
            first_seq[a.seq_ids[0]] = a.request_id
        for s in rec.scheduled:
            tl = lines.get(s.request_id)
            if tl is not None and tl.first_scheduled_time is None:
                tl.first_scheduled_time = rec.start_time
            if tl is not None and s.seq_id in first_seq:
                tl.num_prefix_hit_tokens += s.num_prefix_hit_tokens
        for nt in rec.new_tokens:
            rid = first_seq.get(nt.seq_id)
            if rid is not None:
                lines[rid].token_times.extend([end] * len(nt.token_ids))
        for p in rec.preemptions:
            if p.request_id in lines:
                lines[p.request_id].num_preemptions += 1
        for f in rec.finished:
            rid = first_seq.get(f.seq_id)
            if rid is not None:
                lines[rid].finish_time, lines[rid].finish_reason = end, f.reason
    return lines


def percentiles(values: list[float], ps: tuple[int, ...] = (50, 90, 99)) -> dict[str, float]:
    if not values:
        return {f"p{p}": float("nan") for p in ps} | {"mean": float("nan")}
    vs = sorted(values)
    out = {}
    for p in ps:
        # nearest-rank on the sorted values, interpolated
        k = (len(vs) - 1) * p / 100
        lo, hi = int(k), min(int(k) + 1, len(vs) - 1)
        out[f"p{p}"] = vs[lo] + (vs[hi] - vs[lo]) * (k - lo)
    out["mean"] = statistics.fmean(vs)
    return out


@dataclass
class TraceSummary:
    num_requests: int
    num_steps: int
    wall_time_s: float
    prompt_tokens: int
    computed_prefill_tokens: int
    output_tokens: int
    output_throughput: float  # output tokens / s over the wall time of the run
    total_throughput: float  # (prompt + output) tokens / s
    ttft: dict[str, float]
    tpot: dict[str, float]
    itl: dict[str, float]
    e2e: dict[str, float]
    queue: dict[str, float]
    peak_kv_usage: float
    mean_kv_usage: float
    prefix_hit_rate: float  # hit tokens / queried prompt tokens
    prefix_hit_tokens: int
    num_preemptions: int
    preemption_reasons: dict[str, int]
    spec_acceptance: float | None
    # per phase: achieved FLOP/s and bytes/s against the measured roofs (summarize(..., roofs=...))
    roofline: dict[str, dict[str, float]] | None = None

    def format(self) -> str:
        ms = lambda d: f"p50 {d['p50'] * 1e3:.1f} ms, p90 {d['p90'] * 1e3:.1f} ms, p99 {d['p99'] * 1e3:.1f} ms"
        lines = [
            f"requests {self.num_requests}, steps {self.num_steps}, wall {self.wall_time_s:.2f} s",
            f"throughput: {self.output_throughput:.1f} output tok/s, {self.total_throughput:.1f} total tok/s "
            f"({self.prompt_tokens} prompt + {self.output_tokens} output tokens)",
            f"TTFT: {ms(self.ttft)}",
            f"TPOT: {ms(self.tpot)}",
            f"KV usage: peak {self.peak_kv_usage:.1%}, mean {self.mean_kv_usage:.1%}",
            f"prefix cache: {self.prefix_hit_tokens} tokens hit ({self.prefix_hit_rate:.1%} of looked-up prompt tokens)",
            f"preemptions: {self.num_preemptions}" + (f" {self.preemption_reasons}" if self.preemption_reasons else ""),
        ]
        if self.spec_acceptance is not None:
            lines.append(f"speculative acceptance: {self.spec_acceptance:.1%}")
        for phase, r in (self.roofline or {}).items():
            if phase != "all":
                lines.append(f"roofline {phase}: {r['num_steps']:.0f} steps, median {r['median_intensity']:.1f} FLOP/B, "
                             f"{r['median_achieved_flops_per_s'] / 1e9:.1f} GFLOP/s, "
                             f"{r['median_achieved_bytes_per_s'] / 1e9:.1f} GB/s = {r['median_roof_fraction']:.0%} of the roof")
        return "\n".join(lines)


def summarize(trace: list[StepTrace], roofs: RoofPair | None = None) -> TraceSummary:
    """Serving metrics of a trace; with the machine's roofs, each phase's place on the roofline too."""
    tls = list(request_timelines(trace).values())
    if trace:
        start = min([trace[0].start_time] + [t.arrival_time for t in tls])
        wall = trace[-1].start_time + trace[-1].duration_s - start
    else:
        wall = 0.0
    out_tokens = sum(len(nt.token_ids) for r in trace for nt in r.new_tokens)
    prompt = sum(t.num_prompt_tokens for t in tls)
    queried = sum(r.prefix_queried_tokens for r in trace)
    hits = sum(r.prefix_hit_tokens for r in trace)
    reasons: dict[str, int] = {}
    for r in trace:
        for p in r.preemptions:
            key = p.reason.split(":")[0]
            reasons[key] = reasons.get(key, 0) + 1
    proposed = sum(s.num_proposed for r in trace for s in r.spec)
    accepted = sum(s.num_accepted for r in trace for s in r.spec)
    usage = [r.kv_usage for r in trace]
    return TraceSummary(
        num_requests=len(tls), num_steps=len(trace), wall_time_s=wall,
        prompt_tokens=prompt, computed_prefill_tokens=sum(r.num_prefill_tokens for r in trace),
        output_tokens=out_tokens,
        output_throughput=out_tokens / wall if wall > 0 else 0.0,
        total_throughput=(prompt + out_tokens) / wall if wall > 0 else 0.0,
        ttft=percentiles([t.ttft for t in tls if t.ttft is not None]),
        tpot=percentiles([t.tpot for t in tls if t.tpot is not None]),
        itl=percentiles([x for t in tls for x in t.inter_token_latencies]),
        e2e=percentiles([t.e2e_latency for t in tls if t.e2e_latency is not None]),
        queue=percentiles([t.queue_time for t in tls if t.queue_time is not None]),
        peak_kv_usage=max(usage, default=0.0), mean_kv_usage=sum(usage) / len(usage) if usage else 0.0,
        prefix_hit_rate=hits / queried if queried else 0.0, prefix_hit_tokens=hits,
        num_preemptions=sum(reasons.values()), preemption_reasons=reasons,
        spec_acceptance=accepted / proposed if proposed else None,
        roofline=roofline_summary(trace_roofline(trace, roofs)) if roofs is not None else None,
    )
