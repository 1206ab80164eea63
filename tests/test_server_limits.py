"""The server under careless and hostile clients: every bound answers fast with an OpenAI-style 4xx,
while a normal request on another connection completes; API keys; no internal text in a 500.

One tiny-model server (SlowEngine: every step takes >= 20 ms, so requests overlap) for the module.
"""
from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from minillm.server import create_app
from minillm.server.auth import exposure_warning
from minillm.server.background import ServerThread
from minillm.server.limits import ServerLimits
from minillm.server.protocol import MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS
from tests.test_server_helpers import MODEL_NAME, SlowEngine, tiny_engine

MAX_N = 4
MAX_BYTES = 64 * 1024
QUEUE = 6
BODY = {"model": MODEL_NAME, "prompt": "The cat sat", "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    engine = tiny_engine(engine_cls=SlowEngine, max_num_seqs=8)
    app = create_app(engine, model_name=MODEL_NAME, max_queue_len=QUEUE,
                     limits=ServerLimits(max_n=MAX_N, max_request_bytes=MAX_BYTES))
    with ServerThread(app) as srv:
        srv.engine = engine
        yield srv
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


class Concurrent:
    """A normal request on its own connection, running while the test sends the bad one."""

    def __init__(self, url: str, max_tokens: int = 24) -> None:
        self.result: dict = {}
        body = {**BODY, "max_tokens": max_tokens}
        self.thread = threading.Thread(target=lambda: self.result.update(
            httpx.post(url + "/v1/completions", json=body, timeout=60).json()))

    def __enter__(self) -> "Concurrent":
        self.thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.thread.join(60)
        assert self.result["choices"][0]["finish_reason"] == "length", self.result


def refused_fast(server, body: dict | bytes, status: int, param: str | None = None, code: str | None = None,
                 headers: dict | None = None) -> dict:
    """Send a bad request beside a normal one: it answers `status` within a second; returns the error."""
    with Concurrent(server.url):
        t0 = time.perf_counter()
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        r = httpx.post(server.url + "/v1/completions", timeout=30, headers=headers, **kw)
        took = time.perf_counter() - t0
    err = r.json()["error"]
    assert r.status_code == status, r.text[:500]
    assert took < 1.0, f"took {took:.2f} s"
    assert set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def test_n_is_bounded(server):
    err = refused_fast(server, {**BODY, "n": 20000, "max_tokens": 1}, 400, "n")
    assert f"at most {MAX_N}" in err["message"]


def test_the_queue_counts_sequences_not_prompts(server):
    # QUEUE = 6 sequences: 2 prompts x n=4 is 8, refused though it is only 2 requests
    refused_fast(server, {**BODY, "prompt": ["a b", "c d"], "n": 4}, 429, code="queue_full")
    # the same with n=3 fits (6 sequences) when nothing else runs
    r = httpx.post(server.url + "/v1/completions", json={**BODY, "prompt": ["a b", "c d"], "n": 3}, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"]) == 6


def test_stop_lists_are_bounded(server):
    refused_fast(server, {**BODY, "stop": [f"s{i}" for i in range(100_000)]}, 413)  # 100k strings: over the body limit
    err = refused_fast(server, {**BODY, "stop": [f"s{i}" for i in range(MAX_STOP_STRINGS + 1)]}, 400, "stop")
    assert f"at most {MAX_STOP_STRINGS}" in err["message"]
    refused_fast(server, {**BODY, "stop": ["x" * (MAX_STOP_CHARS + 1)]}, 400, "stop")
    refused_fast(server, {**BODY, "stop_token_ids": list(range(MAX_STOP_TOKEN_IDS + 1))}, 400, "stop_token_ids")


def test_max_tokens_within_the_model_length(server):
    limit = server.engine.max_model_len
    err = refused_fast(server, {**BODY, "max_tokens": limit}, 400, "max_tokens", "context_length_exceeded")
    assert str(limit) in err["message"]


def test_logprobs_are_bounded(server):
    refused_fast(server, {**BODY, "logprobs": 21}, 400, "logprobs")
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def test_a_body_over_the_limit_is_413(server):
    big = json.dumps({**BODY, "prompt": "x" * (MAX_BYTES + 10)}).encode()
    err = refused_fast(server, big, 413, code="request_too_large")
    assert str(MAX_BYTES) in err["message"]


def test_a_chunked_body_over_the_limit_is_413(server):
    """No Content-Length: the server counts as it reads and refuses once the limit is passed."""
    def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(64):  # 64 x 8 KB = 512 KB offered, 8x the limit
            yield b"x" * 8192
        yield b'"}'

    with Concurrent(server.url):
        try:
            r = httpx.post(server.url + "/v1/completions", content=chunks(), timeout=30)
            assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError):
            pass  # the server answered and closed while we were still sending: also a refusal


def test_a_huge_prompt_is_refused_before_tokenizing(server):
    """A text far over the context (in bytes, more than every token of the context could hold) is refused
    without being tokenized: within a second, with the same context_length_exceeded error."""
    prompt = "word " * 12_000  # 60 KB: under the body limit, far over a 2k-token context of short tokens
    err = refused_fast(server, {**BODY, "prompt": prompt}, 400, "prompt", "context_length_exceeded")
    assert "bytes" in err["message"]


def test_tokenizing_runs_off_the_event_loop(server, monkeypatch):
    """While one prompt is being tokenized (made slow here), another connection's request is answered."""
    from minillm.engine import request as request_module
    from minillm.server import prompts

    real = request_module.encode_text

    def slow_encode(tokenizer, text, add_special_tokens=None):
        if text.startswith("SLOW"):
            time.sleep(2.0)
        return real(tokenizer, text, add_special_tokens)

    monkeypatch.setattr(prompts, "encode_text", slow_encode)
    slow = threading.Thread(target=lambda: httpx.post(server.url + "/v1/completions",
                                                      json={**BODY, "prompt": "SLOW prompt"}, timeout=60))
    slow.start()
    time.sleep(0.2)
    t0 = time.perf_counter()
    r = httpx.get(server.url + "/v1/models", timeout=30)
    took = time.perf_counter() - t0
    slow.join(60)
    assert r.status_code == 200 and took < 1.0, took


def test_a_500_names_no_internals(server, monkeypatch):
    from minillm.server import completions

    def broken(*a, **k):
        raise KeyError("secret internal detail /opt/model/path")

    monkeypatch.setattr(completions, "completion_logprobs", broken)
    r = httpx.post(server.url + "/v1/completions", json={**BODY, "logprobs": 1}, timeout=30)
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "internal_error"
    assert "secret" not in r.text and "KeyError" not in r.text


# ----- API keys ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed():
    engine = tiny_engine()
    with ServerThread(create_app(engine, model_name=MODEL_NAME, api_key="s3cret")) as srv:
        yield srv


def test_api_key_with_the_openai_client(keyed):
    good = openai.OpenAI(base_url=keyed.url + "/v1", api_key="s3cret", max_retries=0, timeout=30)
    assert good.completions.create(model=MODEL_NAME, prompt="The cat", max_tokens=2).choices[0].text is not None
    for key in ("wrong", "s3cret-but-longer", "S3CRET"):
        bad = openai.OpenAI(base_url=keyed.url + "/v1", api_key=key, max_retries=0, timeout=30)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.completions.create(model=MODEL_NAME, prompt="The cat", max_tokens=2)
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    r = httpx.get(keyed.url + "/v1/models")  # no header at all
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    # probes and scrapers stay open by default
    assert httpx.get(keyed.url + "/health").status_code == 200
    assert httpx.get(keyed.url + "/metrics").status_code == 200


def test_api_key_on_all_routes():
    app = create_app(tiny_engine(), model_name=MODEL_NAME, api_key="k", protect_all_routes=True, warmup=False)
    with ServerThread(app) as srv:
        assert httpx.get(srv.url + "/health").status_code == 401
        assert httpx.get(srv.url + "/metrics").status_code == 401
        assert httpx.get(srv.url + "/health", headers={"Authorization": "Bearer k"}).status_code == 200


def test_binding_beyond_loopback_without_a_key_warns():
    assert exposure_warning("127.0.0.1", None) is None and exposure_warning("localhost", None) is None
    assert exposure_warning("::1", None) is None
    assert "without an API key" in exposure_warning("0.0.0.0", None)
    assert exposure_warning("0.0.0.0", "k") is None


def test_the_cli_reads_the_key_from_the_environment(monkeypatch):
    from minillm import envs
    from minillm.server.cli import build_parser

    monkeypatch.setenv(envs.MINILLM_API_KEY, "from-env")
    args = build_parser().parse_args([])
    assert (args.api_key or envs.api_key()) == "from-env"
    args = build_parser().parse_args(["--api-key", "flag", "--api-key-all-routes", "--max-n", "3"])
    assert args.api_key == "flag" and args.api_key_all_routes and args.max_n == 3



def test_the_openai_client_sees_each_limit_as_its_status(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)
    ask = dict(model=MODEL_NAME, prompt="The cat", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**{**ask, "n": MAX_N + 1})
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**ask, stop=[str(i) for i in range(MAX_STOP_STRINGS + 1)])
    assert e.value.body["param"] == "stop"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=server.engine.max_model_len)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=MODEL_NAME, prompt="x" * MAX_BYTES, max_tokens=2)
    assert e.value.status_code == 413 and e.value.body["code"] == "request_too_large"
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model=MODEL_NAME, prompt=["a"] * 2, n=MAX_N, max_tokens=2)  # 8 > 6 sequences


def test_integers_past_int64_never_reach_the_engine_as_a_crash(server):
    """A top_k past the vocabulary is no filter (it once overflowed torch.tensor inside the step and stopped
    the engine for everyone); a seed outside torch's range is a 400 naming `seed`."""
    body = {**BODY, "temperature": 1.0, "top_p": 0.5, "top_k": 2**63, "seed": 1}
    assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200
    err = refused_fast(server, {**BODY, "seed": 2**64}, 400, "seed")
    assert "seed" in err["message"]
    last = httpx.post(server.url + "/v1/completions", json={**BODY, "seed": 2**64 - 1, "temperature": 1.0}, timeout=30)
    assert last.status_code == 200 and httpx.get(server.url + "/health").status_code == 200
