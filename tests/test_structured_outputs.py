"""Structured outputs (minillm/structured_outputs.py, engine/grammar.py): every output matches its
schema, regex or choice, checked by outside parsers (json, jsonschema, re); constrained requests leave
their neighbours' outputs unchanged; speculative decoding under a grammar gives the plain engine's
tokens; prefix caching, preemption and n > 1 free every block; bad specs are ValueErrors up front."""
from __future__ import annotations

import json
import re
import threading

import pytest
import torch

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

from minillm import LLM, SamplingParams  # noqa: E402
from minillm.engine.config import EngineConfig  # noqa: E402
from minillm.engine.grammar import row_prefixes, allowed_tokens  # noqa: E402
from minillm.engine.llm_engine import LLMEngine  # noqa: E402
from minillm.structured_outputs import StructuredOutputs  # noqa: E402

NAME = {"type": "string", "maxLength": 24}
SCHEMAS: list[tuple[str, dict]] = [
    ("a person", {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                  "required": ["name", "age"]}),
    ("a book", {"type": "object", "properties": {"title": NAME, "author": NAME, "year": {"type": "integer"}},
                "required": ["title", "author", "year"]}),
    ("a colour", {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]}),
    ("a yes/no answer", {"type": "object", "properties": {"answer": {"type": "boolean"}, "reason": NAME},
                         "required": ["answer", "reason"]}),
    ("a point", {"type": "object", "properties": {"x": {"type": "number", "minimum": -10, "maximum": 10},
                                                  "y": {"type": "number", "minimum": -10, "maximum": 10}},
                 "required": ["x", "y"]}),
    ("a shopping list", {"type": "object", "properties": {"items": {"type": "array", "items": NAME, "minItems": 1,
                                                                    "maxItems": 3}}, "required": ["items"]}),
    ("a product code", {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
                        "required": ["sku"]}),
    ("a city", {"type": "object", "properties": {"city": NAME, "country": NAME, "population": {"type": "integer", "minimum": 0}},
                "required": ["city", "country"]}),
    ("an address", {"type": "object", "properties": {"street": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                                     "geo": {"type": "object", "properties": {"lat": {"type": "number"},
                                                                                              "lon": {"type": "number"}},
                                                             "required": ["lat", "lon"]}},
                    "required": ["street", "zip", "geo"]}),
    ("a list of scores", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "minItems": 2,
                          "maxItems": 4}),
    ("a rating", {"type": "object", "properties": {"stars": {"type": "integer", "enum": [1, 2, 3, 4, 5]}, "text": NAME},
                  "required": ["stars"]}),
    ("an event", {"type": "object", "properties": {"name": NAME, "date": {"type": "string", "pattern": "^2[0-9]{3}-[01][0-9]-[0-3][0-9]$"}},
                  "required": ["name", "date"]}),
    ("a team", {"type": "object", "properties": {"team": NAME, "members": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"name": NAME, "role": {"enum": ["lead", "dev", "qa"]}}, "required": ["name", "role"]}}},
        "required": ["team", "members"]}),
    ("a temperature", {"type": "object", "properties": {"celsius": {"type": "number", "minimum": -50, "maximum": 60}},
                       "required": ["celsius"]}),
    ("a word", {"type": "string", "maxLength": 16}),
    ("a count", {"type": "integer", "minimum": 1, "maximum": 9}),
    ("a flag", {"type": "object", "properties": {"enabled": {"type": "boolean"}}, "required": ["enabled"],
                "additionalProperties": False}),
    ("a recipe", {"type": "object", "properties": {"dish": NAME, "minutes": {"type": "integer", "minimum": 1, "maximum": 300},
                                                   "vegetarian": {"type": "boolean"}},
                  "required": ["dish", "minutes", "vegetarian"]}),
    ("a contact", {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
                                                    "phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}},
                   "required": ["email"]}),
    ("a tagged note", {"type": "object", "properties": {"note": NAME, "tags": {"type": "array", "items": {"enum": ["work", "home", "misc"]},
                                                                              "maxItems": 2}},
                       "required": ["note", "tags"]}),
]


def chat(llm: LLM, what: str) -> str:
    return llm.apply_chat_template([{"role": "user", "content": f"Reply with JSON only: {what}."}])


def json_params(schema: dict, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=kw.pop("max_tokens", 160), structured_outputs={"json": schema}, **kw)


@pytest.fixture(scope="module")
def llm():
    return LLM(num_kv_blocks=256, max_num_seqs=32)


def assert_valid(outputs, schemas) -> None:
    for out, (what, schema) in zip(outputs, schemas):
        text = out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop", (what, text)
        jsonschema.validate(json.loads(text), schema)


# ----- bad input: a ValueError before the request enters the engine -------------------------------
@pytest.mark.parametrize("spec, match", [
    ({"json": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}, "refused"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"json": [1, 2]}, "schema object"),
    ({"regex": "("}, "refused"),
    ({"regex": ""}, "exactly one|non-empty"),
    ({"choice": []}, "exactly one|at least one"),
    ({"choice": "yes"}, "list of strings"),
    ({"grammar": "root ::= ("}, "refused"),
    ({"json_object": True, "regex": "a+"}, "exactly one"),
    ({}, "exactly one"),
    ({"jsn": {}}, "unknown field"),
    # keywords xgrammar would pass without enforcing them: refused, wherever they sit
    ({"json": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}, "#: uniqueItems"),
    ({"json": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}}, "#/properties/a: not"),
    ({"json": {"anyOf": [{"type": "string", "format": "ipv6"}]}}, "format 'ipv6'"),
    ({"json": {"type": "object", "unknownKeyword": 3}}, "unknownKeyword"),
])
def test_a_bad_spec_is_a_value_error(spec, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(structured_outputs=spec)


def test_a_grammar_that_must_end_refuses_ignore_eos_and_min_tokens():
    for kw in ({"ignore_eos": True}, {"min_tokens": 2}):
        with pytest.raises(ValueError, match="grammar's end"):
            SamplingParams(structured_outputs={"choice": ["a"]}, **kw)


def test_equal_specs_share_a_key():
    a = StructuredOutputs(json={"b": 1, "a": {"type": "x"}})
    b = StructuredOutputs(json='{"a": {"type": "x"}, "b": 1}')
    assert a.key() == b.key() and a.key() != StructuredOutputs(regex="x").key()


# ----- the mask, piece by piece ---------------------------------------------------------------------
def test_allowed_tokens_unpacks_the_bitmask_like_a_bit_loop():
    g = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, 5), dtype=torch.int32, generator=g)
    got = allowed_tokens(bitmask.numpy(), 150)
    want = torch.tensor([[(int(bitmask[r, t // 32]) >> (t % 32)) & 1 == 1 for t in range(150)] for r in range(3)])
    assert torch.equal(got, want)


def testrow_prefixes_of_a_chain_and_a_tree():
    assert row_prefixes([7, 8], None, 3) == [[], [7], [7, 8]]
    # tree: node 0 and 1 under the root, node 2 under node 0
    assert row_prefixes([7, 8, 9], [-1, -1, 0], 4) == [[], [7], [8], [7, 9]]


# ----- outputs match, checked by outside parsers ------------------------------------------------------
def test_twenty_schemas_on_the_default_model_all_validate(llm):
    outs = llm.generate([chat(llm, what) for what, _ in SCHEMAS], [json_params(s) for _, s in SCHEMAS])
    assert_valid(outs, SCHEMAS)
    steps = llm.engine.trace
    assert sum(s.grammar_rows for s in steps) >= sum(len(o.outputs[0].token_ids) for o in outs)
    assert all(s.grammar_s > 0 for s in steps if s.grammar_rows)


def test_regex_choice_grammar_and_json_object(llm):
    p = chat(llm, "a person with a name and an age")  # free-form JSON: a prompt this small model ends
    specs = [{"regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"}, {"choice": ["red", "green", "blue \"sky\""]},
             {"grammar": 'root ::= "ab" ("c" | "d") ("c" | "d")? "!"'}, {"json_object": True}]
    outs = llm.generate([p] * 4, [SamplingParams(temperature=0, max_tokens=96, structured_outputs=s) for s in specs])
    text = [o.outputs[0].text for o in outs]
    assert re.fullmatch(specs[0]["regex"], text[0]), text[0]
    assert text[1] in specs[1]["choice"]
    assert re.fullmatch(r"ab[cd][cd]?!", text[2]), text[2]
    assert isinstance(json.loads(text[3]), dict)
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)


def test_sampled_outputs_validate_too(llm):
    what, schema = SCHEMAS[0]
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=160, structured_outputs={"json": schema}) for s in range(6)]
    outs = llm.generate([chat(llm, what)] * 6, params)
    assert_valid(outs, [SCHEMAS[0]] * 6)


def test_constrained_neighbours_leave_plain_outputs_unchanged(llm):
    plain_prompts = [chat(llm, "say hello"), "The capital of France is"]
    greedy = SamplingParams(temperature=0, max_tokens=24)
    alone = [o.outputs[0].token_ids for o in llm.generate(plain_prompts, greedy)]
    mixed = llm.generate([plain_prompts[0], chat(llm, SCHEMAS[1][0]), plain_prompts[1], chat(llm, SCHEMAS[4][0])],
                         [greedy, json_params(SCHEMAS[1][1]), greedy, json_params(SCHEMAS[4][1])])
    assert [mixed[0].outputs[0].token_ids, mixed[2].outputs[0].token_ids] == alone
    assert_valid([mixed[1], mixed[3]], [SCHEMAS[1], SCHEMAS[4]])
    steps = llm.engine.trace[-len(mixed[1].outputs[0].token_ids):]
    assert max(s.grammar_rows for s in steps) <= 2  # only the two constrained rows are masked


# ----- with the rest of the engine: caching, preemption, n > 1, speculation -----------------------------
def test_prefix_caching_preemption_and_n_free_every_block(default_model):
    engine = LLMEngine(default_model.model, default_model.tokenizer, default_model.eos_token_ids,
                       EngineConfig(num_kv_blocks=12, block_size=16, enable_prefix_caching=True, max_num_seqs=12))
    system = "You are a terse assistant that answers in JSON. " * 3
    picks = SCHEMAS[:6]
    for i, (what, schema) in enumerate(picks):
        prompt = default_model.tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": f"Reply with JSON only: {what}."}],
            tokenize=False, add_generation_prompt=True)
        engine.add_request(f"r{i}", prompt, json_params(schema, n=2, max_tokens=110))
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o
    assert sum(len(s.preemptions) for s in engine.trace) > 0, "the pool was meant to be too small for all at once"
    assert sum(s.prefix_hit_tokens for s in engine.trace) > 0
    for i, (what, schema) in enumerate(picks):
        for c in outs[f"r{i}"].outputs:
            assert c.finish_reason == "stop", (what, c.text)
            jsonschema.validate(json.loads(c.text), schema)
    assert engine.block_manager.num_used_blocks == 0


SPECULATIVE = {"ngram": {"method": "ngram", "num_tokens": 4},
               "draft_int4": {"method": "draft", "model": "int4", "num_tokens": 3},
               "medusa_tree": {"method": "medusa", "tree": [[0], [1], [2], [0, 0], [0, 1], [1, 0]]}}


@pytest.mark.parametrize("name", sorted(SPECULATIVE))
def test_speculation_under_a_grammar_gives_the_plain_engines_tokens(default_model, name):
    def run(speculative):
        engine = LLMEngine(default_model.model, default_model.tokenizer, default_model.eos_token_ids,
                           EngineConfig(num_kv_blocks=128, enable_prefix_caching=False, max_num_seqs=8,
                                        speculative=speculative))
        picks = [SCHEMAS[i] for i in (0, 5, 8, 12)]
        for i, (what, schema) in enumerate(picks):
            prompt = default_model.tokenizer.apply_chat_template(
                [{"role": "user", "content": f"Reply with JSON only: {what}."}], tokenize=False, add_generation_prompt=True)
            engine.add_request(f"r{i}", prompt, json_params(schema))
        engine.add_request("choice", "Is the sky blue? Answer:", SamplingParams(
            temperature=0, max_tokens=8, structured_outputs={"choice": [" yes", " no"]}))
        outs = {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    outs[o.request_id] = o.outputs[0]
        assert engine.block_manager.num_used_blocks == 0
        for i, (what, schema) in enumerate(picks):
            jsonschema.validate(json.loads(outs[f"r{i}"].text), schema)
        return {k: v.token_ids for k, v in outs.items()}, engine.trace

    plain, _ = run(None)
    spec, trace = run(SPECULATIVE[name])
    assert spec == plain
    assert sum(r.num_proposed for s in trace for r in s.spec) > 0  # drafts were verified under the mask


def test_a_request_waits_for_its_grammar_while_the_batch_goes_on(default_model, monkeypatch):
    from minillm.engine import grammar

    release = threading.Event()
    slow_compile = grammar.GrammarCompiler._compile

    def held(self, spec):
        release.wait(timeout=60)
        return slow_compile(self, spec)

    monkeypatch.setattr(grammar.GrammarCompiler, "_compile", held)
    engine = LLMEngine(default_model.model, default_model.tokenizer, default_model.eos_token_ids,
                       EngineConfig(num_kv_blocks=64, max_num_seqs=4))
    engine.add_request("plain", "Once upon a time", SamplingParams(temperature=0, max_tokens=6))
    engine.add_request("json", "A JSON object:", json_params(SCHEMAS[2][1]))
    finished = {}
    for _ in range(12):  # the plain request runs to the end while the grammar compiles
        for o in engine.step():
            finished[o.request_id] = o.finished
        if finished.get("plain"):
            break  # (one more step, with nothing else to run, would wait for the compile)
    assert finished.get("plain") is True and "json" not in finished
    assert engine.has_unfinished_requests()
    assert all(sched.request_id == "plain" for s in engine.trace for sched in s.scheduled)
    release.set()
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                jsonschema.validate(json.loads(o.outputs[0].text), SCHEMAS[2][1])
                finished[o.request_id] = True
    assert finished["json"] is True


def test_an_aborted_request_leaves_the_gate(default_model, monkeypatch):
    from minillm.engine import grammar

    release = threading.Event()
    slow_compile = grammar.GrammarCompiler._compile
    monkeypatch.setattr(grammar.GrammarCompiler, "_compile", lambda self, spec: (release.wait(60), slow_compile(self, spec))[1])
    engine = LLMEngine(default_model.model, default_model.tokenizer, default_model.eos_token_ids,
                       EngineConfig(num_kv_blocks=64))
    engine.add_request("json", "A JSON object:", json_params(SCHEMAS[0][1]))
    assert engine.has_unfinished_requests()
    assert engine.abort_request("json")
    assert not engine.has_unfinished_requests()
    release.set()


@pytest.mark.slow
@pytest.mark.real_model
def test_twenty_schemas_on_qwen_coder_0_5b_all_validate():
    from minillm.loader import registry

    if not registry.is_installed("qwen2.5-coder-0.5b"):
        pytest.skip("qwen2.5-coder-0.5b is not installed: " + registry.get_registered("qwen2.5-coder-0.5b").install_command())
    qwen = LLM("qwen2.5-coder-0.5b", num_kv_blocks=256, max_num_seqs=32)
    outs = qwen.generate([chat(qwen, what) for what, _ in SCHEMAS], [json_params(s) for _, s in SCHEMAS])
    assert_valid(outs, SCHEMAS)


def test_the_timeline_marks_the_steps_a_grammar_masked(llm):
    pytest.importorskip("plotly")
    from minillm.visualize import timeline_figure

    first = len(llm.engine.trace)
    llm.generate([chat(llm, SCHEMAS[0][0]), "Hello"], [json_params(SCHEMAS[0][1]), SamplingParams(max_tokens=40, ignore_eos=True)])
    steps = llm.engine.trace[first:]
    marks = [t for t in timeline_figure(steps).data if t.name == "rows masked by a grammar"]
    assert len(marks) == 1
    assert list(marks[0].y) == [s.grammar_rows for s in steps if s.grammar_rows] and max(marks[0].y) == 1
    assert len(marks[0].y) < len(steps)  # the plain request's last steps are unmasked
