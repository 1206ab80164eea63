"""Prompts tokenized as each model expects: text with the tokenizer's own special tokens, chat by its template.

The reference is the model's own `transformers` tokenizer built from the same GGUF
(AutoTokenizer, gguf_file=...): `tokenizer(text).input_ids` for a text prompt, and
`apply_chat_template(..., tokenize=True)` for a conversation. Gemma 3 puts BOS (id 2)
first; SmolLM2 and Qwen2.5 add none, so on them the rule changes nothing.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.request import encode_text
from minillm.loader import registry
from minillm.sampling_params import SamplingParams

PROMPTS = [
    "The tallest mountain on Earth is",
    "The capital of France is",
    "  two leading spaces",
    " one leading space",
    "日本語のテキストです。",
    "中文：你好，世界",
    "emoji 🙂🚀 and more",
    "def quicksort(arr):\n    return arr",
    "   ",
    "\n",
    "Ünïcödé and tabs\tand\nnew lines",
    "<bos> written as text",
]
MESSAGES = [{"role": "user", "content": "Name one planet."}]
# Gemma 3 270M's GGUF (a base model) carries no chat template: the instruct model's shape of one, which
# writes BOS as text, stands in for it, so the test sees whether chat adds a second BOS
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
                  "<end_of_turn>\n{% endfor %}<start_of_turn>model\n")


def hf_tokenizer(path: str):
    from transformers import AutoTokenizer

    p = Path(path)
    return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


def chat_ids(tokenizer, messages, template: str | None = None) -> list[int]:
    """transformers' own chat rendering and tokenizing (its GGUF tokenizer may lack the file's template:
    then the file's template is passed in, the text minillm reads from the same metadata)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        chat_template=None if tokenizer.chat_template else template)
    return list(out["input_ids"] if not isinstance(out, list) else out)


def engine_prompt_ids(engine: LLMEngine, prompt, params: SamplingParams) -> list[int]:
    """The ids the engine queues for a prompt (and records in the trace's arrival), then aborts it."""
    req = engine.add_request(f"p{len(engine.requests)}-{id(prompt)}", prompt, params)
    engine.abort_request(req.request_id)
    return req.prompt_token_ids


def check_tokenizer(ours, theirs) -> None:
    if ours.chat_template is None:
        ours.chat_template = GEMMA_TEMPLATE
    for text in PROMPTS:
        assert encode_text(ours, text) == theirs(text).input_ids, repr(text)
    assert chat_ids(ours, MESSAGES) == chat_ids(theirs, MESSAGES, ours.chat_template)


# ----- fast: the rule itself, on a stand-in tokenizer -------------------------------------------------


class BosTokenizer:
    """Adds BOS (7) when asked to add special tokens, as Gemma's does."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([7] if add_special_tokens else []) + [ord(c) % 50 + 10 for c in text]


def test_text_follows_the_tokenizer_and_chat_adds_no_second_bos():
    tok = BosTokenizer()
    assert encode_text(tok, "ab")[0] == 7  # None: the tokenizer's rule
    assert encode_text(tok, "ab", True)[0] == 7
    assert encode_text(tok, "ab", False) == [ord("a") % 50 + 10, ord("b") % 50 + 10]
    assert encode_text(tok, "") == []  # an empty prompt stays empty (and is refused as such)


def test_add_special_tokens_is_validated():
    for bad in ("yes", 1, 0.0):
        with pytest.raises(ValueError, match="add_special_tokens"):
            SamplingParams(add_special_tokens=bad)
    assert SamplingParams(add_special_tokens=False).add_special_tokens is False


def test_chat_params_keep_an_explicit_choice():
    from minillm.llm import chat_params

    assert chat_params(None).add_special_tokens is False
    assert chat_params(SamplingParams(max_tokens=3)).add_special_tokens is False
    assert chat_params(SamplingParams(add_special_tokens=True)).add_special_tokens is True


# ----- the default model (SmolLM2: no BOS) ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.default_model
def test_default_model_ids_equal_transformers(default_model):
    from minillm.loader import default_model_path

    theirs = hf_tokenizer(default_model_path())
    check_tokenizer(default_model.tokenizer, theirs)
    dm = default_model
    engine = LLMEngine(dm.model, dm.tokenizer, dm.eos_token_ids, EngineConfig(num_kv_blocks=32, max_num_seqs=4))
    text = PROMPTS[0]
    assert engine_prompt_ids(engine, text, SamplingParams()) == theirs(text).input_ids


# ----- Gemma 3 270M (BOS) and the Qwen models, against transformers -------------------------------------

REAL = ["gemma-3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


def installed(name: str) -> str:
    if not registry.is_installed(name):
        pytest.skip(f"{name} is not installed: {registry.get_registered(name).install_command()}")
    return str(registry.resolve_registered(name))


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize("name", REAL)
def test_registered_model_tokenizers_equal_transformers(name):
    from minillm.loader.gguf import load_tokenizer, open_gguf

    path = installed(name)
    _, meta, _ = open_gguf(Path(path))
    ours = load_tokenizer(Path(path), meta)
    check_tokenizer(ours, hf_tokenizer(path))
    adds_bos = bool(meta.get("tokenizer.ggml.add_bos_token"))
    assert (encode_text(ours, "Hi")[0] == ours.bos_token_id) == adds_bos  # the GGUF's own flag decides


NEAR_TIE = 1e-3  # where greedy paths part, transformers' own top-2 logit gap must be below this
GREEDY_TOKENS = 8


def hf_greedy(path: str, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    from transformers import AutoModelForCausalLM

    p = Path(path)
    hf = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=n, do_sample=False, output_logits=True, return_dict_in_generate=True,
                          pad_token_id=0)
    steps = torch.stack(out.logits)[:, 0].float()
    top2 = steps.topk(2, dim=-1).values
    return out.sequences[0, len(ids):].tolist(), (top2[:, 0] - top2[:, 1]).tolist()


def check_greedy(mine: list[int], theirs: list[int], gaps: list[float], what: str) -> None:
    k = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
    if k is None:
        assert mine == theirs[: len(mine)], what
        return
    assert gaps[k] < NEAR_TIE, f"{what}: token {k} is {mine[k]}, transformers' {theirs[k]} (gap {gaps[k]:.2e})"


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize("name", ["gemma-3-270m", "qwen2.5-coder-0.5b"])
def test_text_prompt_greedy_equals_transformers_and_the_server_sends_the_same_ids(name):
    """Gemma: the issue's own case. From text (not ids): our engine and transformers generate the same."""
    import openai

    from minillm import LLM
    from minillm.server import create_app
    from minillm.server.background import ServerThread

    path = installed(name)
    text = PROMPTS[0]
    ids = hf_tokenizer(path)(text).input_ids
    theirs, gaps = hf_greedy(path, ids, GREEDY_TOKENS)
    llm = LLM(name, dtype="float32", num_kv_blocks=32, max_num_seqs=4, max_model_len=512)
    if llm.tokenizer.chat_template is None:
        llm.tokenizer.chat_template = GEMMA_TEMPLATE
    try:
        greedy = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
        out = llm.generate([text], greedy, use_tqdm=False)[0]
        assert out.prompt_token_ids == ids
        check_greedy(out.outputs[0].token_ids, theirs, gaps, f"{name} from text")
        arrivals = [a for t in llm.trace for a in t.arrivals]
        assert list(arrivals[-1].prompt_token_ids) == ids  # a learner sees the BOS in the trace
        chat_out = llm.chat(MESSAGES, SamplingParams(max_tokens=1), use_tqdm=False)[0]
        assert chat_out.prompt_token_ids == chat_ids(llm.tokenizer, MESSAGES)  # one BOS, the template's
        bos = llm.tokenizer.bos_token_id
        assert chat_out.prompt_token_ids.count(bos) == (1 if ids[0] == bos else chat_out.prompt_token_ids.count(bos))
        no_bos = llm.generate([text], dataclasses.replace(greedy, max_tokens=1, add_special_tokens=False),
                              use_tqdm=False)[0]
        assert no_bos.prompt_token_ids == llm.tokenizer.encode(text, add_special_tokens=False)
        engine = llm.engine
        before = len([a for t in engine.trace for a in t.arrivals])
        with ServerThread(create_app(engine, model_name=name)) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
            client.completions.create(model=name, prompt=text, max_tokens=1, temperature=0)
            client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=1, temperature=0)
            client.completions.create(model=name, prompt=text, max_tokens=1, temperature=0,
                                      extra_body={"add_special_tokens": False})
            bad = None
            try:
                client.completions.create(model=name, prompt=text, max_tokens=1,
                                          extra_body={"add_special_tokens": "yes"})
            except openai.BadRequestError as e:
                bad = e
            assert bad is not None
        served = [list(a.prompt_token_ids) for t in engine.trace for a in t.arrivals][before:]
        assert served == [ids, chat_out.prompt_token_ids, no_bos.prompt_token_ids]
    finally:
        llm.close()
