"""Our model, loaded by minillm.loader, against transformers: logits and greedy tokens.

Two sources:
- the default model (SmolLM2-135M-Instruct GGUF), against transformers' own
  load and dequantization of the same file;
- tiny random models of every family, saved as Hugging Face folders.
"""
from __future__ import annotations

import pytest
import torch

from minillm.loader import load_model
from minillm.models.standalone import forward_logits
from tests.helpers.tiny_models import FAMILIES, make_tiny_hf_model

# fp32, same dequantized weights on both sides: what is left is summation order
# (fused qkv / gate_up matmuls, SDPA vs transformers' attention) over 30 layers.
# Measured max |diff| 4e-5 .. 8e-5 on logits of magnitude ~40; tolerance 5e-4.
DEFAULT_ATOL = 5e-4
# Tiny fp32 models (2 layers, logits of magnitude ~7): measured <= 1e-5.
TINY_ATOL = 5e-5
# bf16 weights and activations (8 bits of mantissa) against the fp32 transformers
# model: measured max |diff| 0.12 .. 0.30; transformers' own bf16 model is off by
# 0.15 .. 0.36 on the same prompts. Tolerance 0.6.
TINY_BF16_ATOL = 0.6

TEXT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who " * 3,  # > 3 KV blocks
    "Ünïcödé: 日本語のテキスト 🙂 and numbers 3.14159 2718",
]
CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three colors."},
        {"role": "assistant", "content": "Red, green, blue."},
        {"role": "user", "content": "Two more?"},
    ],
]


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if not isinstance(out, list) else out)


def all_prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer(p).input_ids for p in TEXT_PROMPTS] + [chat_ids(tokenizer, c) for c in CHATS]


def greedy_minillm(model, ids: list[int], n: int, stop: list[int]) -> list[int]:
    """Greedy decoding by re-running the whole sequence each step (slow, obviously correct)."""
    out: list[int] = []
    for _ in range(n):
        nxt = int(forward_logits(model, ids + out)[-1].argmax())
        out.append(nxt)
        if nxt in stop:
            break
    return out


def greedy_transformers(hf_model, ids: list[int], n: int, stop: list[int]) -> list[int]:
    with torch.no_grad():
        seq = hf_model.generate(
            torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=stop, pad_token_id=stop[0]
        )
    return seq[0, len(ids) :].tolist()


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


# ---------------------------------------------------------------- default model


@pytest.mark.default_model
def test_default_model_facts(default_model):
    cfg = default_model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 576, 9, 3)
    assert (cfg.vocab_size, cfg.head_dim, cfg.rope_theta) == (49152, 64, 1e5)
    assert cfg.tie_word_embeddings and default_model.model.lm_head.weight is default_model.model.embed_tokens.weight
    assert default_model.eos_token_ids == [2]  # <|im_end|>
    assert default_model.tokenizer.is_fast and default_model.tokenizer.chat_template
    assert not default_model.model.training
    assert all(not p.requires_grad and p.dtype == torch.float32 for p in default_model.model.parameters())


@pytest.mark.default_model
@pytest.mark.parametrize("which", range(len(TEXT_PROMPTS) + len(CHATS)))
def test_default_model_logits_match_transformers(default_model, hf_default_reference, which):
    ids = all_prompt_ids(default_model.tokenizer)[which]
    ours = forward_logits(default_model.model, ids)
    ref = hf_logits(hf_default_reference, ids)
    assert ours.shape == ref.shape == (len(ids), 49152)
    diff = (ours - ref).abs().max().item()
    assert diff < DEFAULT_ATOL, f"max |logit diff| {diff:.2e}"
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def greedy_minillm_teacher_forced(model, ids: list[int], continuation: list[int]) -> list[int]:
    """What our greedy decoding would produce, checked in one forward pass.

    Causal attention makes row i of forward_logits(ids + continuation) the logits
    of the prefix ending at i. If each row's argmax is the next token of
    `continuation`, step-by-step greedy decoding reproduces `continuation`
    exactly; the first mismatch is where it would diverge. One 135M forward
    instead of 16 (the tiny models below use the step-by-step loop).
    """
    logits = forward_logits(model, ids + continuation)
    return logits[len(ids) - 1 : len(ids) - 1 + len(continuation)].argmax(-1).tolist()


@pytest.mark.default_model
@pytest.mark.parametrize("which", [0, 1, 4])
def test_default_model_greedy_matches_transformers(default_model, hf_default_reference, which):
    ids = all_prompt_ids(default_model.tokenizer)[which]
    theirs = greedy_transformers(hf_default_reference, ids, 16, default_model.eos_token_ids)
    assert greedy_minillm_teacher_forced(default_model.model, ids, theirs) == theirs


@pytest.mark.default_model
def test_default_tokenizer_matches_auto_tokenizer(default_model):
    """We build the GGUF tokenizer with PreTrainedTokenizerFast (2 s faster); AutoTokenizer must agree."""
    from pathlib import Path

    from transformers import AutoTokenizer

    path = Path(default_model.source)
    auto = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ours = default_model.tokenizer
    for text in TEXT_PROMPTS + ["<|im_start|>user\nhi<|im_end|>\n", "  two  spaces\tand\ttabs\n\n"]:
        assert ours(text).input_ids == auto(text).input_ids
    for chat in CHATS:
        assert chat_ids(ours, chat) == chat_ids(auto, chat)
    assert (ours.eos_token_id, ours.bos_token_id) == (auto.eos_token_id, auto.bos_token_id)


# ---------------------------------------------------------------- tiny models of every family


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def tiny(request, tmp_path_factory):
    family = request.param
    folder, hf_model = make_tiny_hf_model(tmp_path_factory.mktemp(family), family)
    return family, folder, hf_model, load_model(str(folder))


def tiny_prompts(tokenizer) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [
        tokenizer("The cat sat on the mat.").input_ids,
        chat_ids(tokenizer, [{"role": "user", "content": "Hello world, what is the answer?"}]),
        torch.randint(0, 320, (70,), generator=gen).tolist(),  # several KV blocks
    ]


def test_tiny_config_is_read_per_family(tiny):
    family, folder, hf_model, loaded = tiny
    cfg, hf_cfg = loaded.config, hf_model.config
    assert cfg.model_type == family
    assert cfg.num_key_value_heads == hf_cfg.num_key_value_heads
    assert cfg.head_dim == hf_model.model.layers[0].self_attn.head_dim
    assert cfg.attention_bias == (family == "qwen2")
    assert cfg.qk_norm == (family == "qwen3")
    assert cfg.tie_word_embeddings == hf_cfg.tie_word_embeddings
    assert (cfg.rope_scaling or {}).get("rope_type") == ("llama3" if family == "llama" else None)
    assert (folder / "model.safetensors.index.json").exists() == (family == "qwen3")
    assert loaded.eos_token_ids == [2]
    assert loaded.generation_config["eos_token_id"] == 2
    assert loaded.tokenizer.chat_template
    assert loaded.source == str(folder.resolve())


def test_tiny_logits_match_transformers(tiny):
    family, _, hf_model, loaded = tiny
    for ids in tiny_prompts(loaded.tokenizer):
        ours, ref = forward_logits(loaded.model, ids), hf_logits(hf_model, ids)
        diff = (ours - ref).abs().max().item()
        assert diff < TINY_ATOL, f"{family}: max |logit diff| {diff:.2e}"
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_tiny_greedy_matches_transformers(tiny):
    family, _, hf_model, loaded = tiny
    for ids in tiny_prompts(loaded.tokenizer)[:2]:
        stop = loaded.eos_token_ids
        assert greedy_minillm(loaded.model, ids, 20, stop) == greedy_transformers(hf_model, ids, 20, stop), family


def test_tiny_bf16_loads_and_runs(tiny):
    family, folder, hf_model, _ = tiny
    loaded = load_model(str(folder), dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    assert loaded.model.rotary.cos.dtype == torch.float32  # RoPE tables stay exact
    for ids in tiny_prompts(loaded.tokenizer):
        ours, ref = forward_logits(loaded.model, ids), hf_logits(hf_model, ids)
        diff = (ours - ref).abs().max().item()
        assert diff < TINY_BF16_ATOL, f"{family} bf16 vs fp32: max |logit diff| {diff:.2e}"
