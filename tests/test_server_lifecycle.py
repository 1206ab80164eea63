"""A server's life (server/lifecycle.py): ready only after its warm-up, exit 1 when a step raises,
drain on SIGTERM and exit 0 with every KV block free."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import httpx

from minillm.server import create_app
from minillm.server.background import ServerThread
from minillm.server.lifecycle import serve_app
from tests.test_server_helpers import MODEL_NAME, SlowEngine, tiny_engine

ROOT = Path(__file__).resolve().parent.parent
BODY = {"model": MODEL_NAME, "prompt": "The cat sat", "max_tokens": 8, "temperature": 0, "ignore_eos": True}


class SlowerEngine(SlowEngine):
    delay = 0.15  # the warm-up's ~10 steps take over a second: long enough to look at


def test_not_ready_until_warmed_up_and_the_warmup_is_not_traffic():
    app = create_app(tiny_engine(engine_cls=SlowerEngine), model_name=MODEL_NAME)
    with ServerThread(app).start(wait_ready=False) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        health = http.get("/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "warming_up"
        early = http.post("/v1/completions", json=BODY)
        assert early.status_code == 503 and early.json()["error"]["code"] == "warming_up"
        deadline = time.monotonic() + 60
        while http.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "never became ready"
            time.sleep(0.05)
        assert http.post("/v1/completions", json=BODY).status_code == 200
        metrics = http.get("/metrics").text
    warmup = [line for line in metrics.splitlines() if line.startswith("minillm:warmup_seconds")]
    assert warmup and float(warmup[0].split()[-1]) > 0.5  # >= 10 steps of 0.15 s
    # the metrics saw exactly one request, the client's, not the three warm-up requests
    done = [line for line in metrics.splitlines() if line.startswith("minillm:request_success_total{")]
    assert sum(float(line.split()[-1]) for line in done) == 1.0, done


def wait_healthy(url: str, running: Callable[[], bool], timeout: float = 120.0) -> None:
    """Poll /health until it says 200 (the server is up and warmed up)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert running() and time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FailingEngine(SlowEngine):
    """Serves normally until `fail_at` steps after it was armed, then raises, as a kernel bug would."""

    armed_at: int | None = None
    steps = 0

    def step(self):
        self.steps += 1
        if self.armed_at is not None and self.steps >= self.armed_at + 5:
            raise RuntimeError("kernel exploded at /secret/path")
        return super().step()


def test_a_step_that_raises_fails_its_requests_turns_health_503_and_exits_1():
    engine = tiny_engine(engine_cls=FailingEngine)
    app = create_app(engine, model_name=MODEL_NAME)
    port = _free_port()
    code: list[int] = []
    runner = threading.Thread(target=lambda: code.append(serve_app(app, "127.0.0.1", port, "warning", grace_s=1)))
    runner.start()
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, runner.is_alive)
    engine.armed_at = engine.steps
    health_after: list[int] = []
    with httpx.Client(base_url=url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json={**BODY, "max_tokens": 200, "stream": True}) as r:
            events = [line for line in r.iter_lines() if line]
            try:  # the server stops right after the failure; /health answers 503 while it is still up
                health_after.append(http.get("/health").status_code)
            except httpx.TransportError:
                pass
    runner.join(30)
    assert not runner.is_alive() and code == [1]
    assert events[-1] == "data: [DONE]" and '"code":"engine_failed"' in events[-2]
    assert "secret" not in "".join(events) and "kernel exploded" not in "".join(events)
    assert health_after in ([], [503])


SERVE_TINY = r"""
import logging, sys
logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")  # as `minillm serve` does
from minillm.server import create_app
from minillm.server.lifecycle import serve_app
from tests.test_server_helpers import MODEL_NAME, SlowEngine, tiny_engine
engine = tiny_engine(engine_cls=SlowEngine)
sys.exit(serve_app(create_app(engine, model_name=MODEL_NAME), "127.0.0.1", int(sys.argv[1]), "info", grace_s=4.0))
"""


def test_sigterm_drains_streams_frees_every_block_and_exits_0():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVE_TINY, str(port)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, lambda: proc.poll() is None)
        results: dict[str, list[str]] = {}
        started = threading.Barrier(4)

        def stream(name: str, max_tokens: int) -> None:
            with httpx.Client(base_url=url, timeout=60) as http:
                body = {**BODY, "max_tokens": max_tokens, "stream": True}
                with http.stream("POST", "/v1/completions", json=body) as r:
                    lines = r.iter_lines()
                    first = next(lines)
                    started.wait(30)
                    results[name] = [first] + [line for line in lines if line]

        # short: finishes well within the 4 s grace (10 steps of >= 20 ms); long: 400 steps (>= 8 s), cut at 4 s
        threads = [threading.Thread(target=stream, args=a) for a in (("short", 10), ("long1", 400), ("long2", 400))]
        for t in threads:
            t.start()
        started.wait(60)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    short = results["short"]
    assert short[-1] == "data: [DONE]" and '"finish_reason":"length"' in short[-2], short[-3:]
    for name in ("long1", "long2"):
        events = results[name]
        assert events[-1] == "data: [DONE]" and '"code":"shutting_down"' in events[-2], events[-3:]
        assert '"finish_reason":"' not in "".join(events[:-2])  # none finished: all were cut
    assert "KV blocks free" in out and "still held" not in out, out[-3000:]
