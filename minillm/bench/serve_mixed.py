"""`minillm bench serve --workload mixed`: many short chats and a few long generations, per scheduling policy.

The question: what does a short chat wait for when long generations hold the
seats? Under "fcfs" it queues behind every long request that came first and
then waits for one to finish; under "priority" (short chats priority 0, long
generations 1) it goes ahead of queued long ones but still waits for a seat;
under "length-aware" a share of the seats is kept for short requests
(engine/policy.py). Each policy gets its own engine on the same loaded weights
and the same seeded arrivals, one after another in this process, behind the
same streaming HTTP clients as `bench serve` (bench/serve.py); the report gives
TTFT / TPOT / e2e P50 / P90 / P99 per class per policy.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any, Callable

from minillm.bench.serve import RequestRecord, bench_serve_records, summarize_serve
from minillm.bench.stats import ratio
from minillm.bench.workload import random_prompt
from minillm.engine.policy import SCHEDULING_POLICIES

CLASSES = ("short", "long")


@dataclass(frozen=True)
class MixedWorkload:
    """Short chats arriving all along, long generations mostly early; both seeded Poisson processes."""

    num_short: int = 24
    num_long: int = 5
    short_prompt_len_range: tuple[int, int] = (16, 48)  # inclusive, uniform
    short_output_len_range: tuple[int, int] = (8, 24)
    long_prompt_len_range: tuple[int, int] = (16, 48)
    long_output_len_range: tuple[int, int] = (96, 128)
    short_rate: float = 2.0  # short requests / s
    long_rate: float = 2.5  # long requests / s (a few, so they arrive near the start)
    short_priority: int = 0  # the request's priority field (read by the "priority" policy only)
    long_priority: int = 1
    max_concurrency: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_short < 1 or self.num_long < 0 or self.max_concurrency < 1:
            raise ValueError("num_short and max_concurrency must be >= 1, num_long >= 0")
        if self.short_rate <= 0 or self.long_rate <= 0:
            raise ValueError(f"arrival rates must be > 0, got {self.short_rate} and {self.long_rate}")
        for lo, hi in (self.short_prompt_len_range, self.short_output_len_range, self.long_prompt_len_range,
                       self.long_output_len_range):
            if not 1 <= lo <= hi:
                raise ValueError(f"a length range must satisfy 1 <= min <= max, got {(lo, hi)}")
        if self.short_max_tokens >= self.long_prompt_len_range[0] + self.long_output_len_range[0]:
            raise ValueError("the longest short request must be shorter than the shortest long one "
                             "(prompt + output), or the classes overlap")

    @property
    def short_max_tokens(self) -> int:
        """The largest prompt + max_tokens of a short request: the engine's short_lane_max_tokens."""
        return self.short_prompt_len_range[1] + self.short_output_len_range[1]

    def requests(self, vocab_size: int) -> list[tuple[float, list[int], int, str, int]]:
        """(send offset s, prompt ids, max tokens, class, priority), by send time; the same every call."""
        rng = random.Random(f"{self.seed}-mixed")
        out = []
        for cls, n, rate, plen, olen, prio in (
                ("long", self.num_long, self.long_rate, self.long_prompt_len_range, self.long_output_len_range,
                 self.long_priority),
                ("short", self.num_short, self.short_rate, self.short_prompt_len_range, self.short_output_len_range,
                 self.short_priority)):
            t = 0.0
            for _ in range(n):
                out.append((t, random_prompt(rng, rng.randint(*plen), vocab_size), rng.randint(*olen), cls, prio))
                t += rng.expovariate(rate)
        out.sort(key=lambda r: (r[0], r[3]))  # stable: at t = 0 the long one is sent first
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "arrival": "two seeded Poisson processes (short, long), both from t=0",
                "prompts": "random token ids sent as the prompt", "sampling": "greedy, ignore_eos",
                "endpoint": "/v1/completions, stream=true, include_usage, priority field when non-zero"}


def summarize_by_class(records: list[RequestRecord], wall_s: float) -> dict[str, Any]:
    """summarize_serve per class and for all requests together."""
    out = {cls: summarize_serve([r for r in records if r.cls == cls], wall_s) for cls in CLASSES}
    out["all"] = summarize_serve(records, wall_s)
    return out


def parse_policies(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in SCHEDULING_POLICIES]
    if bad or not names:
        raise ValueError(f"unknown scheduling policy {', '.join(bad) or repr(text)}; "
                         f"choose from {', '.join(SCHEDULING_POLICIES)}")
    return list(dict.fromkeys(names))


def measure_policies(make_engine: Callable[[str], Any], tokenizer: Any, policies: list[str],
                     workload: MixedWorkload, vocab_size: int, log: Callable[[str], None] = lambda s: None,
                     ) -> dict[str, Any]:
    """Serve the workload once per policy (a fresh engine from make_engine(policy) each time)."""
    from minillm.server.app import create_app
    from minillm.server.background import ServerThread

    name = "minillm-bench"
    per_policy: dict[str, Any] = {}
    for policy in policies:
        engine = make_engine(policy)
        # trace_window=None: the server keeps every step record, read below (a few hundred steps)
        with ServerThread(create_app(engine, tokenizer, name, trace_window=None)) as srv:
            log(f"{policy}: {workload.num_short} short + {workload.num_long} long requests at {srv.url}")
            records, wall = bench_serve_records(srv.url, name, workload, vocab_size)
        per_policy[policy] = summarize_by_class(records, wall)
        per_policy[policy]["engine"] = engine_figures(engine.trace)
        del engine  # its KV pool goes before the next one is allocated
    base = policies[0]
    short_p99 = {p: s["short"]["ttft_s"]["p99"] for p, s in per_policy.items()}
    return {"policies": per_policy,
            "short_ttft_p99_s": short_p99,
            "short_ttft_p99_cut_vs_" + base: {p: ratio(short_p99[base], v) for p, v in short_p99.items()},
            "long_e2e_p99_s": {p: s["long"]["e2e_s"]["p99"] for p, s in per_policy.items()}}


def engine_figures(trace: list) -> dict[str, Any]:
    """What the engine did (from its step trace): steps, preemptions, mean seats per lane."""
    busy = [t for t in trace if t.scheduled]
    seats: dict[str, float] = {}
    for t in busy:
        for q in t.queue:
            if q.running:
                seats[q.lane or "all"] = seats.get(q.lane or "all", 0.0) + 1 / len(busy)
    return {"scheduling_policy": busy[-1].scheduling_policy if busy else None, "num_steps": len(busy),
            "num_preemptions": sum(len(t.preemptions) for t in trace), "mean_running_per_lane": seats}


def format_mixed(summary: dict[str, Any]) -> str:
    ms = lambda x: f"{x * 1e3:8.0f}" if x == x else "     nan"
    lines = ["mixed workload, per scheduling policy and class: P50 / P99 in ms",
             f"  {'policy':13s} {'class':5s} {'n':>3s}  {'TTFT p50':>8s} {'TTFT p99':>8s}  {'TPOT p50':>8s} "
             f"{'TPOT p99':>8s}  {'e2e p50':>8s} {'e2e p99':>8s}"]
    for policy, s in summary["policies"].items():
        for cls in CLASSES:
            c = s[cls]
            lines.append(f"  {policy:13s} {cls:5s} {c['num_completed']:3d}  {ms(c['ttft_s']['p50'])} "
                         f"{ms(c['ttft_s']['p99'])}  {ms(c['tpot_s']['p50'])} {ms(c['tpot_s']['p99'])}  "
                         f"{ms(c['e2e_s']['p50'])} {ms(c['e2e_s']['p99'])}")
        a, e = s["all"], s["engine"]
        lines.append(f"  {'':13s} wall {a['wall_s']:.1f} s, {a['output_tok_s']:.1f} output tok/s, "
                     f"{e['num_steps']} steps, {e['num_preemptions']} preemptions, {a['num_errors']} errors")
    base, cut = next((k[len("short_ttft_p99_cut_vs_"):], v) for k, v in summary.items()
                     if k.startswith("short_ttft_p99_cut_vs_"))
    lines.append(f"  short-request TTFT P99 cut vs {base}: " +
                 ", ".join(f"{p} x{c:.2f}" if c is not None else f"{p} n/a" for p, c in cut.items()))
    return "\n".join(lines)
