"""A server's life: warm up before it says ready, drain on SIGTERM, exit non-zero when the engine fails.

    warming up --(warm_up)--> ready --(SIGTERM: begin_draining)--> draining --> exit 0
                                 \\--(a step raises)--> /health 503, uvicorn stops --> exit 1

Warm-up: a server that builds kernels and compiles on its first request gives that client
a long first token; real deployments send warm-up requests before going online. Here the
prompt thread renders and encodes a chat once, then one request runs alone (prefill, batch-1
decode) and two together (batched prefill and decode), through every path a real request takes,
while /health answers 503 and /v1 refuses with 503; the seconds it took are logged and exported
(`minillm:warmup_seconds`).

Draining: admissions stop (503), requests in flight get `grace_s` to finish, the rest are
aborted (a stream's last event says so), every KV block is freed, the process exits 0.
Engine failure: the requests in the step fail with a 500 that names no internals, /health
turns 503 and `minillm serve` exits 1, so a supervisor restarts it (vLLM's behaviour).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from typing import Iterator

import uvicorn
from prometheus_client import Gauge

from minillm.sampling_params import SamplingParams
from minillm.server.async_engine import ServerShuttingDown
from minillm.server.prompts import warm_prompt_path
from minillm.server.state import DRAINING, READY, WARMING_UP, ServerState

log = logging.getLogger("minillm.server")

WARMUP_TOKENS = 4


def warmup_prompts(state: ServerState) -> list[list[int]]:
    """Two prompts of different lengths (so the batched step holds rows of unequal length)."""
    vocab = state.engine.engine.model_config.vocab_size
    short = [(7 * i + 3) % vocab for i in range(8)]
    return [short, [(11 * i + 5) % vocab for i in range(min(19, state.max_model_len - WARMUP_TOKENS - 1))]]


async def warm_up(state: ServerState) -> float:
    """Run the warm-up requests (neither the metrics nor the trace keep them), then mark the server ready;
    returns the seconds they took."""
    if state.phase != WARMING_UP:
        return 0.0
    engine, t0 = state.engine, time.perf_counter()
    params = SamplingParams(max_tokens=WARMUP_TOKENS, temperature=0.0, ignore_eos=True)
    engine.warming_up = True  # not traffic: kept out of the metrics and the trace
    try:
        tok = state.prompt_tokenizer
        if tok is not None:  # the prompt thread's first template render and encode (jinja compiles the template)
            await state.off_loop(warm_prompt_path, tok)
        short, long = warmup_prompts(state)
        await _drain(await engine.add_request("warmup-0", short, params))
        streams = [await engine.add_request(f"warmup-{i}", ids, params) for i, ids in enumerate((short, long), 1)]
        await asyncio.gather(*(_drain(s) for s in streams))
    finally:
        engine.warming_up = False
    seconds = time.perf_counter() - t0
    Gauge("minillm:warmup_seconds", "seconds the server's warm-up requests took before it reported ready",
          registry=state.metrics.registry).set(seconds)
    if state.phase == WARMING_UP:
        state.phase = READY
    log.info("warm-up done in %.2f s (prefill, batch-1 and batch-2 decode); the server is ready", seconds)
    return seconds


async def _drain(stream) -> None:
    async for _ in stream:
        pass


def begin_draining(state: ServerState, grace_s: float) -> threading.Timer | None:
    """Stop admissions now; after grace_s, abort what is still running. None if already draining."""
    if state.phase == DRAINING:
        return None
    state.phase = DRAINING
    busy = state.engine.num_unfinished
    log.info("shutting down: no new requests; %d in flight get %.1f s to finish", busy, grace_s)
    timer = threading.Timer(grace_s, state.engine.abort_all,
                            args=(ServerShuttingDown(f"the server is shutting down (grace period {grace_s:g} s over)"),))
    timer.daemon = True
    timer.start()
    return timer


def pool_report(state: ServerState) -> str:
    bm = state.engine.engine.block_manager
    held = bm.num_blocks - bm.num_free_blocks
    return f"all {bm.num_blocks} KV blocks free" if held == 0 else f"{held} of {bm.num_blocks} KV blocks still held"


class GracefulServer(uvicorn.Server):
    """uvicorn, whose first SIGTERM/SIGINT drains the engine; uvicorn's own grace outlasts ours, so every
    stream ends with its last event before uvicorn would cut the connection."""

    def __init__(self, config: uvicorn.Config, state: ServerState, grace_s: float) -> None:
        super().__init__(config)
        self.state, self.grace_s = state, grace_s

    def handle_exit(self, sig, frame) -> None:
        begin_draining(self.state, self.grace_s)
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, except that the signal is not raised again after the shutdown: a drained server exits 0."""
        if threading.current_thread() is not threading.main_thread():  # signals reach only the main thread
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve_app(app, host: str, port: int, log_level: str = "info", grace_s: float = 30.0) -> int:
    """Run the app until SIGTERM/SIGINT (0) or an engine failure (1): `minillm serve`'s exit status."""
    state: ServerState = app.state.server
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=grace_s + 5)
    server = GracefulServer(config, state, grace_s)

    def stop_on_failure(error: BaseException) -> None:
        log.critical("the engine failed (%s); the server exits so a supervisor can restart it", type(error).__name__)
        server.should_exit = True

    state.engine.on_failure.append(stop_on_failure)
    server.run()
    return 1 if state.engine.error is not None else 0
