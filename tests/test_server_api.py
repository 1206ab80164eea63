"""The OpenAI-compatible API against a live server on loopback, with the official `openai` client.

One tiny-model server for the module (see test_server_helpers); answers are
compared with the engine's own greedy output for the same prompt.
"""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from minillm.sampling_params import SamplingParams
from minillm.server import create_app
from minillm.server.background import ServerThread
from tests.helpers.tiny_tokenizer import make_tiny_tokenizer
from tests.test_server_helpers import MODEL_NAME, SlowEngine, offline, tiny_engine

PROMPT = "The cat sat"
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def server():
    engine = tiny_engine()
    with ServerThread(create_app(engine, model_name=MODEL_NAME)) as srv:
        srv.engine = engine
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference():
    return offline(PROMPT, GREEDY)[0]


def chat_messages(text: str = "What is the answer?") -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


def chat_reference(params: SamplingParams):
    prompt = make_tiny_tokenizer().apply_chat_template(chat_messages(), tokenize=False, add_generation_prompt=True)
    return offline(prompt, params, chat=True), len(make_tiny_tokenizer().encode(prompt, add_special_tokens=False))


# ----- plain endpoints ------------------------------------------------------------------

def test_health_and_models(server, client):
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


# ----- completions ------------------------------------------------------------------------

def test_completion_matches_engine(client, reference):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0)
    assert r.object == "text_completion" and r.model == MODEL_NAME
    assert r.choices[0].text == reference.text
    assert r.choices[0].finish_reason == "length"
    n_prompt = len(make_tiny_tokenizer().encode(PROMPT))  # the tokenizer's BOS first, as for any text prompt
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (n_prompt, 24, n_prompt + 24)


def test_completion_token_ids_and_batch(client, reference):
    tok = make_tiny_tokenizer()
    ids = [tok.encode(p) for p in (PROMPT, "Hello world")]
    other = offline("Hello world", GREEDY)[0].text
    for prompt in (ids, [PROMPT, "Hello world"]):
        r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0)
        assert [c.index for c in r.choices] == [0, 1]
        assert [c.text for c in r.choices] == [reference.text, other]
        assert r.usage.prompt_tokens == sum(map(len, ids)) and r.usage.completion_tokens == 48


def test_completion_stream_equals_whole(client, reference):
    stream = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == reference.text
    assert sum(1 for c in chunks if c.choices and c.choices[0].text) > 3  # it streamed, not one lump
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24


def test_sse_wire_format(server):
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    for e in events[:-1]:
        assert json.loads(e[len("data: "):])["object"] == "text_completion"


def test_n2_with_seed(client):
    kw = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=1.0, n=2, seed=7, extra_body={"top_k": 5})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # seeded: reproducible
    ref = offline(PROMPT, SamplingParams(n=2, temperature=1.0, top_k=5, seed=7, max_tokens=12))
    assert [c.text for c in a.choices] == [o.text for o in ref]
    assert a.usage.completion_tokens == 24


def test_n2_stream(client):
    stream = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=10, temperature=0, n=2, stream=True)
    texts = {0: "", 1: ""}
    reasons = {}
    for c in stream:
        for ch in c.choices:
            texts[ch.index] += ch.text
            if ch.finish_reason:
                reasons[ch.index] = ch.finish_reason
    ref = offline(PROMPT, SamplingParams(temperature=0.0, max_tokens=10))[0].text
    assert texts == {0: ref, 1: ref} and reasons == {0: "length", 1: "length"}


def test_stop_string(client, reference):
    stop = reference.text[6:8]
    want = reference.text[: reference.text.find(stop)]
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    # streamed: the stop string must not leak out before it is recognised
    stream = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == want


def test_stop_token_ids_min_tokens_ignore_eos(client, reference):
    # a stop token that first appears after the first output token: min_tokens=1 bans it only at
    # position 0, where greedy picked another token anyway, so the output is the reference's up to it
    ids = reference.token_ids
    stop = next(t for t in ids if t != ids[0])
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0,
                                  extra_body={"stop_token_ids": [stop], "min_tokens": 1})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == ids.index(stop) + 1
    # min_tokens past the stop's position: the stop token cannot end the output before min_tokens
    at_least = ids.index(stop) + 3
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0,
                                  extra_body={"stop_token_ids": [stop], "min_tokens": at_least})
    assert r.usage.completion_tokens >= at_least
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True, "min_p": 0.0, "skip_special_tokens": True,
                                              "some_unknown_vllm_knob": 3})
    assert r.usage.completion_tokens == 5 and r.choices[0].text == offline(
        PROMPT, SamplingParams(temperature=0.0, max_tokens=5))[0].text


def test_completion_logprobs(client, reference):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    assert "".join(lp.tokens) == r.choices[0].text == reference.text[: len(r.choices[0].text)]
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert val <= 0 and 1 <= len(top) <= 3
        assert top[tok] == pytest.approx(val) and val == pytest.approx(max(top.values()))  # greedy: the top one
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


# ----- chat ----------------------------------------------------------------------------------

def test_chat_matches_engine(client):
    ref, n_prompt = chat_reference(SamplingParams(temperature=0.0, max_tokens=16))
    r = client.chat.completions.create(model=MODEL_NAME, messages=chat_messages(), max_tokens=16, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == ref[0].text
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, 16)
    r2 = client.chat.completions.create(model=MODEL_NAME, messages=chat_messages(), max_completion_tokens=16,
                                        temperature=0)
    assert r2.choices[0].message.content == ref[0].text


def test_chat_stream(client):
    ref, n_prompt = chat_reference(SamplingParams(temperature=0.0, max_tokens=16))
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=chat_messages(), max_tokens=16,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.prompt_tokens == n_prompt and chunks[-1].usage.total_tokens == n_prompt + 16


def test_chat_logprobs_and_content_parts(client):
    msgs = chat_messages()
    parts = [{"type": "text", "text": "What is "}, {"type": "text", "text": "the answer?"}]
    msgs[1] = {"role": "user", "content": parts}
    r = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=2)
    ref, _ = chat_reference(SamplingParams(temperature=0.0, max_tokens=6))
    assert r.choices[0].message.content == ref[0].text  # the parts joined give the same prompt
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for item in content:
        assert len(item.top_logprobs) == 2 and item.top_logprobs[0].logprob == pytest.approx(item.logprob)
        assert bytes(item.bytes).decode() == item.token


# ----- errors --------------------------------------------------------------------------------

def error_of(exc: openai.APIStatusError) -> dict:
    body = exc.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize("kwargs, param", [
    (dict(temperature=-1), "temperature"),
    (dict(top_p=0), "top_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(n=0), "n"),
    (dict(logprobs=21), "logprobs"),
    (dict(presence_penalty=1.0), "presence_penalty"),
    (dict(extra_body={"top_k": -5}), "top_k"),
    (dict(extra_body={"min_tokens": 30}), "min_tokens"),
])
def test_bad_parameters_are_400(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_NAME, prompt=PROMPT, **{"max_tokens": 8, **kwargs})
    assert e.value.status_code == 400
    err = error_of(e.value)
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_prompt_errors_are_400(client, server):
    limit = server.engine.max_model_len
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_NAME, prompt=[5] * limit, max_tokens=1)
    assert error_of(e.value)["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_NAME, prompt=[5] * (limit - 10), max_tokens=20)
    assert error_of(e.value)["param"] == "max_tokens"
    for empty in ("", [], [[]]):
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=MODEL_NAME, prompt=empty, max_tokens=4)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_NAME, prompt=[10_000], max_tokens=4)  # outside the vocabulary
    assert error_of(e.value)["param"] == "prompt"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_NAME, messages=[], max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_NAME, messages=chat_messages(), top_logprobs=2)


def test_malformed_bodies_are_400_not_422(server):
    url = server.url + "/v1/completions"
    for body in ({"model": MODEL_NAME, "prompt": PROMPT, "temperature": "hot"}, {"model": MODEL_NAME},
                 {"model": MODEL_NAME, "prompt": {"a": 1}}):
        r = httpx.post(url, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400


def test_unknown_model_and_route(client, server):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-9", prompt=PROMPT, max_tokens=2)
    assert error_of(e.value)["code"] == "model_not_found"
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


# ----- metrics ---------------------------------------------------------------------------------

def test_metrics_endpoint(server, client):
    client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, temperature=0)
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {(s.name, s.labels.get("finished_reason")): s.value
               for f in text_string_to_metric_families(r.text) for s in f.samples}
    assert samples[("minillm:generation_tokens_total", None)] >= 5
    assert samples[("minillm:prompt_tokens_total", None)] > 0
    assert samples[("minillm:request_success_total", "length")] >= 1
    assert samples[("minillm:time_to_first_token_seconds_count", None)] >= 1
    assert ("minillm:kv_cache_usage_perc", None) in samples


# ----- limits ----------------------------------------------------------------------------------

def test_queue_full_is_429_and_disconnect_aborts():
    """max_queue_len=1: while one request streams, the next gets 429; leaving mid-stream frees its blocks."""
    engine = tiny_engine(engine_cls=SlowEngine)
    app = create_app(engine, model_name=MODEL_NAME, max_queue_len=1)
    ae = app.state.server.engine
    with ServerThread(app) as srv:
        body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 400, "temperature": 0, "stream": True}
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")  # it is running
                busy = http.post("/v1/completions", json={**body, "stream": False, "max_tokens": 2})
                assert busy.status_code == 429
                assert busy.json()["error"]["code"] == "queue_full"
            # the stream was closed after one chunk: the server aborts it
            deadline = time.monotonic() + 10
            while ae.num_unfinished and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ae.num_unfinished == 0
            ok = http.post("/v1/completions", json={**body, "stream": False, "max_tokens": 2})
            assert ok.status_code == 200
            assert http.get("/health").status_code == 200
            text = http.get("/metrics").text
            assert 'minillm:request_success_total{finished_reason="abort",model_name="tiny"} 1.0' in text
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.has_unfinished_requests() and not engine.requests
