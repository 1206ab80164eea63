"""Structured outputs through the server on the default model (SmolLM2-135M-Instruct): OpenAI's
response_format (json_schema, json_object), vLLM's structured_outputs and its older guided_* fields,
whole and streamed; each bad spec a 400 naming its field; a constrained request beside an
unconstrained one leaves the other's greedy output as it is alone.

One server for the module; small schemas with bounded strings and temperature 0, so the 135M model
finishes well inside max_tokens.
"""
from __future__ import annotations

import json
import re
import threading

import httpx
import jsonschema
import openai
import pytest

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.server import create_app
from minillm.server.background import ServerThread
from minillm.structured_outputs import MAX_CHOICES

pytest.importorskip("xgrammar")

pytestmark = [pytest.mark.slow, pytest.mark.default_model]

NAME = "SmolLM2-135M-Instruct"
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
ASK_PERSON = [{"role": "user", "content": "Give me a person as JSON with a name and an age."}]
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
CHOICES = ["Paris", "London", "Berlin", "Madrid"]


@pytest.fixture(scope="module")
def server(default_model):
    dm = default_model
    engine = LLMEngine(dm.model, dm.tokenizer, dm.eos_token_ids,
                       EngineConfig(block_size=16, num_kv_blocks=64, max_num_seqs=8, max_num_batched_tokens=256))
    with ServerThread(create_app(engine, model_name=NAME)) as srv:
        srv.engine = engine
        yield srv
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def refused(server, body: dict, param: str, route: str = "/v1/chat/completions") -> str:
    """POST a bad body: a 400 in OpenAI's error shape naming `param`; returns the message."""
    base = {"model": NAME, "max_tokens": 8, "temperature": 0}
    if route.endswith("chat/completions"):
        base["messages"] = ASK_PERSON
    else:
        base["prompt"] = "The capital of France is"
    r = httpx.post(server.url + route, json={**base, **body}, timeout=60)
    assert r.status_code == 400, r.text[:500]
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    return err["message"]


def test_chat_json_schema_whole_and_streamed(client):
    r = client.chat.completions.create(model=NAME, messages=ASK_PERSON, max_tokens=96, temperature=0,
                                       response_format=JSON_SCHEMA_FORMAT)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text
    jsonschema.validate(json.loads(text), PERSON)

    chunks = list(client.chat.completions.create(model=NAME, messages=ASK_PERSON, max_tokens=96, temperature=0,
                                                 response_format=JSON_SCHEMA_FORMAT, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(streamed), PERSON)
    assert streamed == text  # greedy: the same tokens, whole or streamed


def test_chat_json_object(client):
    r = client.chat.completions.create(model=NAME, messages=ASK_PERSON, max_tokens=96, temperature=0,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    assert r.choices[0].finish_reason == "stop"


def test_completions_regex_choice_and_guided_choice(client):
    pattern = r"[0-9]{3}-[0-9]{4}"
    r = client.completions.create(model=NAME, prompt="My phone number is", max_tokens=96, temperature=0,
                                  extra_body={"structured_outputs": {"regex": pattern}})
    assert re.fullmatch(pattern, r.choices[0].text), r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    for extra in ({"structured_outputs": {"choice": CHOICES}}, {"guided_choice": CHOICES}):
        r = client.completions.create(model=NAME, prompt="The capital of France is", max_tokens=96, temperature=0,
                                      extra_body=extra)
        assert r.choices[0].text in CHOICES, (extra, r.choices[0].text)


def test_response_format_text_is_unconstrained(client):
    plain = client.chat.completions.create(model=NAME, messages=ASK_PERSON, max_tokens=6, temperature=0)
    text = client.chat.completions.create(model=NAME, messages=ASK_PERSON, max_tokens=6, temperature=0,
                                          response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content


def test_bad_specs_are_400s_naming_their_field(server):
    bad_schema = {"type": "object", "properties": {"a": {"type": "no-such-type"}}}
    msg = refused(server, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": bad_schema}}},
                  "response_format")
    assert "response_format.json_schema.schema" in msg
    refused(server, {"structured_outputs": {"json": bad_schema}}, "structured_outputs")
    refused(server, {"guided_json": "{not json"}, "guided_json")
    assert "regex" in refused(server, {"structured_outputs": {"regex": "("}}, "structured_outputs",
                              route="/v1/completions")
    refused(server, {"guided_regex": "("}, "guided_regex", route="/v1/completions")
    assert "choice" in refused(server, {"structured_outputs": {"choice": []}}, "structured_outputs")
    refused(server, {"guided_choice": []}, "guided_choice")
    refused(server, {"structured_outputs": {"choice": ["x"] * (MAX_CHOICES + 1)}}, "structured_outputs")
    # two constraints at once, or two inside structured_outputs, or none there
    msg = refused(server, {"response_format": JSON_SCHEMA_FORMAT, "structured_outputs": {"regex": "a+"}},
                  "structured_outputs")
    assert "response_format" in msg and "structured_outputs" in msg
    refused(server, {"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice", route="/v1/completions")
    refused(server, {"structured_outputs": {"regex": "a+", "choice": ["a"]}}, "structured_outputs")
    refused(server, {"structured_outputs": {}}, "structured_outputs")
    refused(server, {"structured_outputs": {"regexp": "a+"}}, "structured_outputs")  # a typo is not ignored
    # the grammar's end is the request's end
    assert "ignore_eos" in refused(server, {"response_format": JSON_SCHEMA_FORMAT, "ignore_eos": True},
                                   "response_format")
    refused(server, {"guided_choice": CHOICES, "min_tokens": 2}, "guided_choice", route="/v1/completions")
    # the OpenAI shape itself
    refused(server, {"response_format": {"type": "yaml"}}, "response_format")
    refused(server, {"response_format": {"type": "json_schema"}}, "response_format")


def test_constrained_beside_unconstrained(client):
    """A constrained request batched with an unconstrained one: both finish, and the unconstrained
    greedy output is what it is alone (the mask touches only the constrained request's rows). The
    constrained one starts once the other has streamed its first token, and ends before it."""
    prompt, n_plain = "The history of the city of Rome began", 48
    plain = dict(model=NAME, prompt=prompt, max_tokens=n_plain, temperature=0, extra_body={"ignore_eos": True})
    alone = client.completions.create(**plain).choices[0].text
    result: dict[str, object] = {}

    def constrained() -> None:
        try:
            result["json"] = client.chat.completions.create(model=NAME, messages=ASK_PERSON, max_tokens=96,
                                                            temperature=0, response_format=JSON_SCHEMA_FORMAT)
            result["done_at_chunk"] = len(pieces)
        except Exception as e:  # surfaced by the asserts below
            result["json"] = e

    pieces: list[str] = []
    job = threading.Thread(target=constrained)
    for chunk in client.completions.create(**plain, stream=True):
        pieces.append(chunk.choices[0].text if chunk.choices else "")
        if len(pieces) == 1:
            job.start()
    job.join(120)
    assert "".join(pieces) == alone
    assert not isinstance(result["json"], Exception), result["json"]
    jsonschema.validate(json.loads(result["json"].choices[0].message.content), PERSON)
    assert result["done_at_chunk"] < n_plain, "the constrained request did not run beside the other"
