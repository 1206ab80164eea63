"""`minillm bench serve`: concurrent streaming clients against a live OpenAI-compatible server.

The clients speak HTTP to `/v1/completions` with `stream: true` (SSE) on
loopback, exactly as any OpenAI client would, so the figures include the
server's tokenization, scheduling, detokenization and streaming, not just the
engine. Per request we record when it was sent, when each chunk arrived and the
usage the server reports, and derive:

- TTFT: send -> first chunk with text;  e2e: send -> last chunk;
- TPOT: (e2e - TTFT) / (output tokens - 1)  (vLLM's definition);
- ITL: the gaps between consecutive chunks of a request;
- request and output-token throughput over the whole run.

Arrivals are a seeded Poisson process at `request_rate` (inf: all at once),
and at most `max_concurrency` requests are in flight.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from minillm.bench.stats import percentiles
from minillm.bench.workload import random_prompt


@dataclass(frozen=True)
class ServeWorkload:
    """Chat-like lengths: a few hundred prompt tokens, a few dozen to a couple of hundred answer tokens."""

    num_requests: int = 64
    prompt_len_range: tuple[int, int] = (32, 384)  # inclusive, uniform
    output_len_range: tuple[int, int] = (16, 192)
    request_rate: float = float("inf")  # requests / s (Poisson); inf: all at t=0
    max_concurrency: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1 or self.max_concurrency < 1:
            raise ValueError("num_requests and max_concurrency must be >= 1")
        if self.request_rate <= 0:
            raise ValueError(f"request_rate must be > 0 (inf for all at once), got {self.request_rate}")
        for lo, hi in (self.prompt_len_range, self.output_len_range):
            if not 1 <= lo <= hi:
                raise ValueError(f"a length range must satisfy 1 <= min <= max, got {(lo, hi)}")

    def requests(self, vocab_size: int) -> list[tuple[float, list[int], int]]:
        """(send offset in s, prompt token ids, max tokens) per request, the same for every call."""
        rng = random.Random(f"{self.seed}-serve")
        t, out = 0.0, []
        for _ in range(self.num_requests):
            prompt = random_prompt(rng, rng.randint(*self.prompt_len_range), vocab_size)
            out.append((t, prompt, rng.randint(*self.output_len_range)))
            if self.request_rate != float("inf"):
                t += rng.expovariate(self.request_rate)
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["request_rate"] = None if self.request_rate == float("inf") else self.request_rate
        return {**d, "arrival": "all at t=0" if self.request_rate == float("inf") else "Poisson, seeded",
                "prompts": "random token ids sent as the prompt", "sampling": "greedy, ignore_eos",
                "endpoint": "/v1/completions, stream=true, include_usage"}


@dataclass
class RequestRecord:
    sent: float
    chunk_times: list[float] = field(default_factory=list)  # chunks that carried text or tokens
    prompt_tokens: int = 0
    output_tokens: int = 0
    max_tokens: int = 0
    error: str | None = None
    cls: str = ""  # a mixed workload's request class ("short" / "long"); "" otherwise
    priority: int = 0  # sent as the request's priority field when non-zero

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.sent if self.chunk_times else None

    @property
    def e2e(self) -> float | None:
        return self.chunk_times[-1] - self.sent if self.chunk_times else None

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2 or not self.chunk_times:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]


async def _one(http: Any, model: str, prompt: list[int], max_tokens: int, rec: RequestRecord) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    if rec.priority:  # only where a workload sets one (a server without a priority policy may refuse it)
        body["priority"] = rec.priority
    rec.sent = time.perf_counter()
    try:
        async with http.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    rec.error = str(obj["error"])
                    return
                if any(ch.get("text") for ch in obj.get("choices", [])):
                    rec.chunk_times.append(time.perf_counter())
                if obj.get("usage"):
                    rec.prompt_tokens = obj["usage"]["prompt_tokens"]
                    rec.output_tokens = obj["usage"]["completion_tokens"]
    except Exception as e:  # a client-side failure is a result to report, not a crash of the benchmark
        rec.error = f"{type(e).__name__}: {e}"


async def run_clients(url: str, model: str, workload: ServeWorkload, vocab_size: int,
                      timeout_s: float = 600.0) -> tuple[list[RequestRecord], float]:
    """Drive the workload against a server at url; returns the records (in request order) and the wall time.

    workload.requests(vocab_size) gives (send offset, prompt ids, max tokens) per request, optionally
    followed by (class, priority) -- a MixedWorkload (bench/serve_mixed.py)."""
    import httpx

    reqs = workload.requests(vocab_size)
    records = [RequestRecord(0.0, max_tokens=r[2], cls=r[3] if len(r) > 3 else "", priority=r[4] if len(r) > 4 else 0)
               for r in reqs]
    gate = asyncio.Semaphore(workload.max_concurrency)
    limits = httpx.Limits(max_connections=workload.max_concurrency + 4,
                          max_keepalive_connections=workload.max_concurrency + 4)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout_s) as http:
        t0 = time.perf_counter()

        async def launch(i: int) -> None:
            offset, prompt, max_tokens = reqs[i][:3]
            delay = t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                await _one(http, model, prompt, max_tokens, records[i])

        await asyncio.gather(*(launch(i) for i in range(len(reqs))))
        wall = time.perf_counter() - t0
    return records, wall


def summarize_serve(records: list[RequestRecord], wall_s: float) -> dict[str, Any]:
    """Every figure of the run: percentiles (p50/p90/p99 and mean) in seconds, throughput per second."""
    ok = [r for r in records if r.error is None and r.chunk_times]

    def pct(values: list[float]) -> dict[str, float]:
        out = percentiles(values)
        out["mean"] = sum(values) / len(values) if values else float("nan")
        return out

    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "num_requests": len(records),
        "num_completed": len(ok),
        "errors": [r.error for r in records if r.error is not None][:10],
        "num_errors": sum(r.error is not None for r in records),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else float("nan"),
        "output_tok_s": out_tokens / wall_s if wall_s > 0 else float("nan"),
        "total_tok_s": (out_tokens + sum(r.prompt_tokens for r in ok)) / wall_s if wall_s > 0 else float("nan"),
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens": out_tokens,
        "requested_output_tokens": sum(r.max_tokens for r in records),
        "ttft_s": pct([r.ttft for r in ok if r.ttft is not None]),
        "tpot_s": pct([r.tpot for r in ok if r.tpot is not None]),
        "itl_s": pct([x for r in ok for x in r.itl]),
        "e2e_s": pct([r.e2e for r in ok if r.e2e is not None]),
    }


async def serve_records_async(url: str, model: str, workload: Any, vocab_size: int,
                              warmup: bool = True) -> tuple[list[RequestRecord], float]:
    """The workload's records and wall time, after one short warm-up request."""
    if warmup:
        await run_clients(url, model, ServeWorkload(1, (8, 8), (4, 4), seed=workload.seed + 1), vocab_size)
    return await run_clients(url, model, workload, vocab_size)


def bench_serve_records(url: str, model: str, workload: Any, vocab_size: int,
                        warmup: bool = True) -> tuple[list[RequestRecord], float]:
    """serve_records_async from synchronous code."""
    return asyncio.run(serve_records_async(url, model, workload, vocab_size, warmup))


async def bench_serve_async(url: str, model: str, workload: ServeWorkload, vocab_size: int,
                            warmup: bool = True) -> dict[str, Any]:
    """Run the workload (after one short warm-up request) and summarize it; `await` it where a loop
    already runs (a notebook)."""
    return summarize_serve(*await serve_records_async(url, model, workload, vocab_size, warmup))


def bench_serve(url: str, model: str, workload: ServeWorkload, vocab_size: int,
                warmup: bool = True) -> dict[str, Any]:
    """bench_serve_async from synchronous code (the CLI)."""
    return asyncio.run(bench_serve_async(url, model, workload, vocab_size, warmup))
