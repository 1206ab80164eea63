"""Bounded load: 200 concurrent streams against a tiny model, a tenth of the clients leaving mid-stream.

Every client that stays gets its whole completion, /health answers 200
throughout, the leavers are aborted (their blocks freed at once, counted as
"abort" in /metrics), and afterwards the KV pool is whole and no request remains.
"""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minillm.server import create_app
from minillm.server.background import ServerThread
from tests.test_server_helpers import MODEL_NAME, tiny_engine

NUM_CLIENTS = 200
MAX_TOKENS = 24
PROMPTS = ["The cat sat", "Hello world! What is", "One, two, three,", "def add(a, b):", "the sun, the moon and"]


def leaves_after(i: int) -> int | None:
    """Chunks client i reads before hanging up (None: it stays). Half leave at once, half after a few tokens."""
    if i % 10:
        return None
    return 0 if i % 20 == 0 else 3


async def client_run(http: httpx.AsyncClient, i: int) -> dict:
    leave = leaves_after(i)
    body = {"model": MODEL_NAME, "prompt": PROMPTS[i % len(PROMPTS)], "stream": True, "seed": i,
            "temperature": 0.0 if i % 2 else 0.8, "max_tokens": 400 if leave is not None else MAX_TOKENS,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    got = {"i": i, "left": False, "text": "", "finish": None, "usage": None, "done": False}
    async with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        chunks = 0
        async for line in r.aiter_lines():
            if leave is not None and chunks >= leave:
                got["left"] = True
                return got  # leaving the block closes the connection mid-stream
            if not line:
                continue
            assert line.startswith("data: "), line
            data = line[len("data: "):]
            if data == "[DONE]":
                got["done"] = True
                break
            obj = json.loads(data)
            assert "error" not in obj, obj
            for ch in obj["choices"]:
                got["text"] += ch["text"]
                got["finish"] = ch["finish_reason"] or got["finish"]
            if obj.get("usage"):
                got["usage"] = obj["usage"]
            chunks += 1
    return got


async def watch_health(http: httpx.AsyncClient, stop: asyncio.Event) -> list[int]:
    codes = []
    while not stop.is_set():
        codes.append((await http.get("/health")).status_code)
        await asyncio.sleep(0.1)
    return codes


async def drive(url: str) -> tuple[list[dict], list[int]]:
    limits = httpx.Limits(max_connections=NUM_CLIENTS + 10, max_keepalive_connections=NUM_CLIENTS + 10)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http, \
            httpx.AsyncClient(base_url=url, timeout=10) as probe:
        stop = asyncio.Event()
        health = asyncio.create_task(watch_health(probe, stop))
        try:
            results = await asyncio.gather(*(client_run(http, i) for i in range(NUM_CLIENTS)))
        finally:
            stop.set()
        return results, await health


@pytest.mark.slow
def test_200_concurrent_streams_with_disconnects():
    # a small pool, so that running requests are preempted (recomputed) while others are aborted
    engine = tiny_engine(num_blocks=192, block_size=4, max_num_seqs=64, max_num_batched_tokens=256)
    app = create_app(engine, model_name=MODEL_NAME, max_queue_len=NUM_CLIENTS + 20)
    ae = app.state.server.engine
    with ServerThread(app) as srv:
        t0 = time.monotonic()
        results, health = asyncio.run(asyncio.wait_for(drive(srv.url), timeout=90))
        elapsed = time.monotonic() - t0
        deadline = time.monotonic() + 20  # aborts are commands: give the engine thread a moment
        while (ae.num_unfinished or engine.has_unfinished_requests()) and time.monotonic() < deadline:
            time.sleep(0.02)
        metrics = httpx.get(srv.url + "/metrics").text
        assert httpx.get(srv.url + "/health").status_code == 200

    stayed = [r for r in results if leaves_after(r["i"]) is None]
    left = [r for r in results if leaves_after(r["i"]) is not None]
    assert len(stayed) == 180 and len(left) == 20 and all(r["left"] for r in left)
    for r in stayed:
        assert r["done"] and r["finish"] == "length" and r["text"], r
        assert r["usage"]["completion_tokens"] == MAX_TOKENS
    assert health and all(c == 200 for c in health), health

    # nothing leaked: the pool is whole and the engine is empty
    assert ae.num_unfinished == 0
    assert not engine.has_unfinished_requests() and not engine.requests
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks

    reasons = {s.labels["finished_reason"]: s.value for f in text_string_to_metric_families(metrics)
               for s in f.samples if s.name == "minillm:request_success_total"}
    assert reasons["length"] == len(stayed) and reasons["abort"] == len(left)
    preempted = [s.value for f in text_string_to_metric_families(metrics) for s in f.samples
                 if s.name == "minillm:num_preemptions_total"]
    assert preempted[0] > 0  # 64 seats x ~8 blocks each > 192 blocks: aborts met preemptions too
    assert elapsed < 60
