"""Prometheus metrics fed from the step trace alone.

    metrics = TraceMetrics(model_name="my-model")   # its own CollectorRegistry
    metrics.observe(new_records)                   # each StepTrace exactly once, in order
    prometheus_client.generate_latest(metrics.registry)

Names follow vLLM's under a `minillm:` prefix so existing dashboards carry
over. prometheus_client appends `_total` to counters: the counter created as
`minillm:prompt_tokens` is exposed as `minillm:prompt_tokens_total`.

Conventions (the same as minillm.metrics.from_trace):
- a token's time is the end of the step that produced it;
- a request's TTFT and inter-token latencies are those of its first
  completion (sequence index 0); its queue time runs from arrival to the
  start of the first step that scheduled it;
- a request finishes when all its n sequences have finished; its
  `finished_reason` is that of its first completion ("stop", "length",
  "abort");
- `prompt_tokens` counts a request's prompt once, when its first token is
  produced (vLLM counts prefill work the same way; recomputation after a
  preemption is not counted again);
- `iteration_tokens_total` observes steps that computed tokens (the engine
  may record empty steps that only report arrivals or aborts).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from minillm.engine.trace import StepTrace
from minillm.roofline.steps import RoofPair, step_roofline

# Bucket edges as in vLLM, so histograms from both engines line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISH_REASONS = ("stop", "length", "abort")


@dataclass
class _Live:
    """What the observer remembers about a request between its arrival and its finish."""

    arrival_time: float
    num_prompt_tokens: int
    first_seq: int
    open_seqs: set[int]
    scheduled: bool = False
    last_token_time: float | None = None  # of the first completion
    finish_reason: str | None = None  # of the first completion
    finish_time: float = 0.0


@dataclass
class _Index:
    live: dict[str, _Live] = field(default_factory=dict)
    seq_to_request: dict[int, str] = field(default_factory=dict)


class TraceMetrics:
    """A Prometheus view of the engine, updated from StepTrace records only."""

    def __init__(self, model_name: str = "minillm", registry: CollectorRegistry | None = None,
                 roofs: RoofPair | None = None) -> None:
        """roofs: the machine's measured roofs; with them, each step's fraction of its roof is exported too."""
        self.roofs = roofs
        self.registry = registry if registry is not None else CollectorRegistry()
        self.model_name = model_name
        r, lab = self.registry, ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"minillm:{name}", doc, lab, registry=r)

        def counter(name: str, doc: str, extra: list[str] | None = None) -> Counter:
            return Counter(f"minillm:{name}", doc, lab + (extra or []), registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"minillm:{name}", doc, lab, buckets=buckets, registry=r)

        self.num_requests_running = gauge(
            "num_requests_running", "Sequences holding KV blocks after the last step.")
        self.num_requests_waiting = gauge(
            "num_requests_waiting", "Sequences waiting to be scheduled after the last step.")
        self.kv_cache_usage_perc = gauge(
            "kv_cache_usage_perc", "KV-cache usage: fraction of blocks referenced (1 = 100%).")
        self.prefix_cache_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.num_preemptions = counter("num_preemptions", "Sequences preempted (recomputed later).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of requests that produced their first token.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.request_success = counter("request_success", "Finished requests by finish reason.", ["finished_reason"])
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds", "Arrival to the first output token.", TTFT_BUCKETS)
        self.time_per_output_token = histogram(
            "time_per_output_token_seconds", "Time between consecutive output tokens of a request.", TPOT_BUCKETS)
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds", "Arrival to the last sequence finishing.", LATENCY_BUCKETS)
        self.request_queue_time = histogram(
            "request_queue_time_seconds", "Arrival to the first step that scheduled the request.", LATENCY_BUCKETS)
        self.iteration_tokens = histogram(
            "iteration_tokens_total", "Tokens computed per engine step.", ITERATION_TOKEN_BUCKETS)
        # The roofline of the last step that computed tokens (analytic FLOPs and bytes over its wall time),
        # plus running totals: rate(minillm:model_flops_total) / rate(minillm:engine_step_seconds_total)
        # is the average achieved FLOP/s over any window.
        self.step_flops_per_second = gauge("step_achieved_flops_per_second", "Achieved FLOP/s of the last step.")
        self.step_bytes_per_second = gauge("step_achieved_bytes_per_second", "Achieved bytes/s of the last step.")
        self.step_intensity = gauge("step_arithmetic_intensity", "FLOPs per byte moved of the last step.")
        self.model_flops = counter("model_flops", "Analytic FLOPs of all steps.")
        self.model_bytes = counter("model_bytes", "Analytic bytes moved (weights, KV read and written) of all steps.")
        self.step_seconds = counter("engine_step_seconds", "Wall time of the steps that computed tokens.")
        roof_metrics = []
        if roofs is not None:
            self.step_roof_fraction = gauge(
                "step_roof_fraction", "Last step's achieved FLOP/s over the roof at its intensity (1 = on the roof).")
            self.step_bandwidth_fraction = gauge(
                "step_bandwidth_fraction", "Last step's achieved bytes/s over the measured bandwidth roof.")
            self.roof_bandwidth = gauge("roof_bandwidth_bytes_per_second", "The machine's measured bandwidth roof (the faster of a read and a copy probe).")
            self.roof_flops = gauge("roof_peak_flops_per_second", "The machine's measured matmul FLOP/s (the best of several GEMM shapes).")
            self.roof_bandwidth.labels(model_name).set(roofs.bandwidth_bytes_per_s)
            self.roof_flops.labels(model_name).set(roofs.peak_flops_per_s)
            roof_metrics = [self.step_roof_fraction, self.step_bandwidth_fraction]
        # Create every series now so a scrape shows zeros rather than nothing before the first request.
        for metric in (self.num_requests_running, self.num_requests_waiting, self.kv_cache_usage_perc,
                       self.prefix_cache_queries, self.prefix_cache_hits, self.num_preemptions, self.prompt_tokens,
                       self.generation_tokens, self.time_to_first_token, self.time_per_output_token,
                       self.e2e_request_latency, self.request_queue_time, self.iteration_tokens,
                       self.step_flops_per_second, self.step_bytes_per_second, self.step_intensity, self.model_flops,
                       self.model_bytes, self.step_seconds, *roof_metrics):
            metric.labels(model_name)
        for reason in FINISH_REASONS:
            self.request_success.labels(model_name, reason)
        self._index = _Index()
        self.num_records = 0  # records consumed so far

    def observe(self, records: Iterable[StepTrace]) -> None:
        """Consume new records, oldest first. Each record must be passed exactly once."""
        for rec in records:
            self._observe_one(rec)
            self.num_records += 1

    def _observe_one(self, rec: StepTrace) -> None:
        m, idx = self.model_name, self._index
        end = rec.start_time + rec.duration_s
        for a in rec.arrivals:
            idx.live[a.request_id] = _Live(a.arrival_time, a.num_prompt_tokens, a.seq_ids[0], set(a.seq_ids))
            for sid in a.seq_ids:
                idx.seq_to_request[sid] = a.request_id
        for s in rec.scheduled:
            req = idx.live.get(s.request_id)
            if req is not None and not req.scheduled:
                req.scheduled = True
                self.request_queue_time.labels(m).observe(rec.start_time - req.arrival_time)
        generated = 0
        for nt in rec.new_tokens:
            generated += len(nt.token_ids)
            req = idx.live.get(idx.seq_to_request.get(nt.seq_id, ""))
            if req is None or nt.seq_id != req.first_seq:
                continue
            for _ in nt.token_ids:
                if req.last_token_time is None:
                    self.time_to_first_token.labels(m).observe(end - req.arrival_time)
                    self.prompt_tokens.labels(m).inc(req.num_prompt_tokens)
                else:
                    self.time_per_output_token.labels(m).observe(end - req.last_token_time)
                req.last_token_time = end
        if generated:
            self.generation_tokens.labels(m).inc(generated)
        for f in rec.finished:
            rid = idx.seq_to_request.pop(f.seq_id, None)
            req = idx.live.get(rid) if rid is not None else None
            if req is None:
                continue
            req.open_seqs.discard(f.seq_id)
            req.finish_time = end
            if f.seq_id == req.first_seq:
                req.finish_reason = f.reason
            if not req.open_seqs:
                del idx.live[rid]
                self.e2e_request_latency.labels(m).observe(req.finish_time - req.arrival_time)
                self.request_success.labels(m, req.finish_reason or f.reason).inc()
        if rec.preemptions:
            self.num_preemptions.labels(m).inc(len(rec.preemptions))
        if rec.prefix_queried_tokens:
            self.prefix_cache_queries.labels(m).inc(rec.prefix_queried_tokens)
        if rec.prefix_hit_tokens:
            self.prefix_cache_hits.labels(m).inc(rec.prefix_hit_tokens)
        if rec.num_tokens:
            self.iteration_tokens.labels(m).observe(rec.num_tokens)
            self._observe_roofline(rec)
        self.num_requests_running.labels(m).set(rec.num_running)
        self.num_requests_waiting.labels(m).set(rec.num_waiting)
        self.kv_cache_usage_perc.labels(m).set(rec.kv_usage)

    def _observe_roofline(self, rec: StepTrace) -> None:
        m = self.model_name
        self.model_flops.labels(m).inc(rec.flops)
        self.model_bytes.labels(m).inc(rec.bytes_moved)
        if rec.duration_s > 0:
            self.step_seconds.labels(m).inc(rec.duration_s)
        self.step_intensity.labels(m).set(rec.arithmetic_intensity)
        self.step_flops_per_second.labels(m).set(rec.achieved_flops_per_s)
        self.step_bytes_per_second.labels(m).set(rec.bytes_moved / rec.duration_s if rec.duration_s > 0 else 0.0)
        if self.roofs is not None:
            row = step_roofline(rec, self.roofs)
            self.step_roof_fraction.labels(m).set(row.roof_fraction)
            self.step_bandwidth_fraction.labels(m).set(row.bandwidth_fraction)
