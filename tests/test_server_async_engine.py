"""AsyncEngine without HTTP: the one engine thread, its commands, its observers, and what happens when a step fails."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from minillm.engine.llm_engine import LLMEngine, RequestError
from minillm.metrics.prometheus import TraceMetrics
from minillm.sampling_params import SamplingParams
from minillm.server import AsyncEngine, EngineDeadError, create_app
from minillm.server.background import ServerThread
from tests.test_server_helpers import MODEL_NAME, SlowEngine, offline, tiny_engine


class CountingEngine(LLMEngine):
    steps = 0

    def step(self):
        self.steps += 1
        return super().step()


class BrokenEngine(LLMEngine):
    """Its fourth step raises, as a bug in a kernel would."""

    steps = 0

    def step(self):
        self.steps += 1
        if self.steps == 4:
            raise RuntimeError("kernel exploded")
        return super().step()


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_outputs_match_the_engine_and_observers_see_each_step_once():
    engine = tiny_engine(engine_cls=CountingEngine)
    metrics = TraceMetrics("t")
    ae = AsyncEngine(engine, [metrics.observe], trace_window=8)
    tok = engine.tokenizer
    prompts = ["The cat sat", "Hello world", "One, two"]
    params = SamplingParams(temperature=0.0, max_tokens=30)

    async def main():
        ae.start()
        try:
            streams = [await ae.add_request(f"r{i}", tok.encode(p), params)  # a text prompt's ids: BOS first
                       for i, p in enumerate(prompts)]
            finals = []
            for s in streams:
                async for out in s:
                    pass
                finals.append(out)
            with pytest.raises(RequestError):
                await ae.add_request("bad", [], params)
            return finals
        finally:
            ae.shutdown()

    finals = run(main())
    assert [f.outputs[0].text for f in finals] == [offline(p, params)[0].text for p in prompts]
    assert all(f.finished for f in finals)
    # every step went to the observer exactly once, although the trace was trimmed behind it
    assert metrics.num_records == engine.steps and engine.steps > 2 * 8
    assert len(engine.trace) <= 2 * 8
    assert metrics.registry.get_sample_value("minillm:request_success_total",
                                             {"model_name": "t", "finished_reason": "length"}) == 3
    assert ae.num_unfinished == 0


def test_abort_frees_blocks():
    engine = tiny_engine(engine_cls=SlowEngine)
    ae = AsyncEngine(engine)

    async def main():
        ae.start()
        try:
            s = await ae.add_request("long", [5, 6, 7, 8, 9], SamplingParams(temperature=0.0, max_tokens=400))
            await s.next()
            ae.abort("long")
            for _ in range(500):
                if ae.num_unfinished == 0:
                    break
                await asyncio.sleep(0.01)
        finally:
            ae.shutdown()

    run(main())
    assert ae.num_unfinished == 0 and not engine.requests
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_failed_step_ends_streams_and_health():
    engine = tiny_engine(engine_cls=BrokenEngine)
    app = create_app(engine, model_name=MODEL_NAME, warmup=False)  # the fourth step is the request's
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        body = {"model": MODEL_NAME, "prompt": "The cat sat", "max_tokens": 50, "temperature": 0, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as r:
            events = [line for line in r.iter_lines() if line]
        assert events[-1] == "data: [DONE]"
        # a 500-type error event that names no internals (the server's log has the traceback)
        assert '"type":"internal_error"' in events[-2] and '"code":"engine_failed"' in events[-2]
        assert "kernel exploded" not in events[-2] and "RuntimeError" not in events[-2]
        health = http.get("/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "engine_failed"
        assert "kernel exploded" not in health.text
        again = http.post("/v1/completions", json={**body, "stream": False})
        assert again.status_code == 503 and again.json()["error"]["code"] == "engine_unavailable"
    assert isinstance(app.state.server.engine.error, RuntimeError)


def test_non_streaming_client_that_leaves_is_aborted():
    engine = tiny_engine(engine_cls=SlowEngine)
    app = create_app(engine, model_name=MODEL_NAME)
    ae = app.state.server.engine
    with ServerThread(app) as srv:
        body = {"model": MODEL_NAME, "prompt": "The cat sat", "max_tokens": 400, "temperature": 0}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/v1/completions", json=body, timeout=0.5)
        deadline = time.monotonic() + 10
        while ae.num_unfinished and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ae.num_unfinished == 0
        assert 'finished_reason="abort",model_name="tiny"} 1.0' in httpx.get(srv.url + "/metrics").text
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks and not engine.requests


def test_not_started_is_dead():
    ae = AsyncEngine(tiny_engine())

    async def main():
        with pytest.raises(EngineDeadError):
            await ae.add_request("x", [1, 2], SamplingParams())

    run(main())
