"""Gemma 3 against transformers: the real 270M GGUF, and tiny random models.

The real model (registry name "gemma-3-270m", Q4_K_M, the base model) is loaded
once through ``LLM`` (the front door) and once by transformers from the same
file; both dequantize to float32, so what is left is summation order. Its
local layers attend to a 512-token window, so a prompt longer than that tests
the window (and a run with the window switched off must *not* match). Skipped
when the model's wheels are not installed (``minillm models`` says how).

Measured (2 cores, fp32, the engine's K-major weight layout): max |logit diff|
vs transformers 2.9e-5 .. 8.4e-5 on logits of magnitude 20-35 (short prompts)
and 9.2e-5 at the last 32 positions of a 600-token prompt (with the windows
switched off: 17); tolerance 3e-4. Tiny random models: <= 6e-6; tolerance 5e-5.
About 2 minutes on 2 cores, most of it loading the model twice.
"""
from __future__ import annotations

import pydoc_data.topics
import pytest
import torch

from minillm.attention.metadata import AttentionMetadata
from minillm.attention.triton_backend import TritonAttentionBackend
from minillm.config import ModelConfig
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.models.gemma3 import Gemma3ForCausalLM
from minillm.models.standalone import attach_private_cache, forward_logits
from minillm.sampling_params import SamplingParams

MODEL = "gemma-3-270m"
ATOL = 3e-4
TINY_ATOL = 5e-5
NEAR_TIE = 1e-3  # transformers' own top-2 logit gap below which either token is a correct greedy choice
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who " * 3,
    "Ünïcödé: 日本語のテキスト 🙂 and numbers 3.14159 2718",
]


def installed() -> bool:
    from minillm.loader.registry import model_status

    status = model_status(MODEL)
    return status.assembled or not status.missing


@pytest.fixture(scope="module")
def llm():
    if not installed():
        pytest.skip(f"{MODEL} is not installed (`minillm models` prints the pip command)")
    from minillm import LLM

    return LLM(MODEL, num_kv_blocks=160, block_size=16)  # 2560 tokens of KV: plenty, and cheap


@pytest.fixture(scope="module")
def hf(llm):
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    path = Path(llm.loaded.source)
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def long_ids(llm) -> list[int]:
    """600 tokens of Python's own documentation: past the 512-token window."""
    text = "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    ids = llm.tokenizer(text[:8000]).input_ids[:600]
    assert len(ids) == 600 and llm.loaded.config.sliding_window == 512
    return ids


@torch.inference_mode()
def last_logits(model, ids: list[int], n: int) -> torch.Tensor:
    """Logits of the last n positions only (a 262k vocabulary makes every row 1 MB)."""
    table = attach_private_cache(model, len(ids))
    meta = AttentionMetadata.build([len(ids)], [len(ids)], [table], 16)
    hidden = model(torch.tensor(ids), torch.arange(len(ids)), meta)
    return model.compute_logits(hidden[-n:])


@torch.inference_mode()
def hf_logits(hf, ids: list[int], n: int = 0) -> torch.Tensor:
    return hf(torch.tensor([ids]), logits_to_keep=n).logits[0].float()


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


# ---------------------------------------------------------------- the real model


def test_config_from_gguf(llm, hf):
    cfg, ref = llm.loaded.config, hf.config
    assert cfg.model_type == "gemma3" and isinstance(llm.loaded.model, Gemma3ForCausalLM)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.head_dim, cfg.vocab_size) == (18, 640, 256, 262144)
    assert cfg.layer_types == list(ref.layer_types)
    assert cfg.sliding_window == ref.sliding_window == 512
    assert cfg.query_pre_attn_scalar == ref.query_pre_attn_scalar
    assert cfg.rope_theta == ref.rope_parameters["full_attention"]["rope_theta"]
    assert cfg.rope_local_base_freq == ref.rope_parameters["sliding_attention"]["rope_theta"]
    assert cfg.final_logit_softcapping == ref.final_logit_softcapping
    assert cfg.tie_word_embeddings and llm.loaded.model.lm_head.weight is llm.loaded.model.embed_tokens.weight
    windows = [a.sliding_window for a in llm.loaded.model.attention_layers()]
    assert windows == [512 if t == "sliding_attention" else None for t in ref.layer_types]


@pytest.mark.parametrize("which", range(len(PROMPTS)))
def test_logits_match_transformers(llm, hf, which):
    ids = llm.tokenizer(PROMPTS[which]).input_ids
    assert ids[0] == llm.loaded.config.bos_token_id
    ours, ref = forward_logits(llm.loaded.model, ids), hf_logits(hf, ids)
    assert ours.shape == ref.shape == (len(ids), 262144)
    diff = (ours - ref).abs().max().item()
    print(f"prompt {which}: {len(ids)} tokens, max |logit diff| {diff:.2e}")
    assert diff < ATOL, f"max |logit diff| {diff:.2e}"
    clear = top2_gap(ref) > NEAR_TIE
    assert torch.equal(ours.argmax(-1)[clear], ref.argmax(-1)[clear])


def test_greedy_matches_transformers(llm, hf):
    """32 greedy tokens per prompt through the engine (batched, paged decode) vs transformers.

    Checked teacher-forced, as in test_model_vs_transformers.py: row i of transformers' logits over
    prompt + our tokens is its greedy choice after our first i tokens; where every row's argmax is our
    next token, its step-by-step greedy decoding reproduces ours. One forward instead of 32 steps."""
    prompts = [llm.tokenizer(p).input_ids for p in PROMPTS]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False)
    compared = 0
    for ids, out in zip(prompts, outs):
        ours = list(out.outputs[0].token_ids)
        assert len(ours) == 32 or ours[-1] in llm.loaded.eos_token_ids
        ref = hf_logits(hf, ids + ours[:-1], len(ours))  # the rows that chose each of our tokens
        theirs, gaps = ref.argmax(-1).tolist(), top2_gap(ref).tolist()
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if a != b:  # allowed only where transformers itself hardly prefers its token
                assert gaps[i] < NEAR_TIE, f"token {i}: ours {a}, transformers {b} (gap {gaps[i]:.2e})"
                break
            compared += 1
    print(f"greedy: {compared} of {sum(len(o.outputs[0].token_ids) for o in outs)} tokens compared")
    assert compared >= 64  # near-ties are rare: most tokens were actually compared


def test_long_prompt_past_the_window(llm, hf, long_ids):
    model = llm.loaded.model
    ref = hf_logits(hf, long_ids, 32)
    ours = last_logits(model, long_ids, 32)
    diff = (ours - ref).abs().max().item()
    print(f"long prompt: max |logit diff| {diff:.2e} at the last 32 positions")
    assert diff < ATOL, f"max |logit diff| {diff:.2e} at the last 32 of {len(long_ids)} positions"
    # the same model with every window switched off is a different model here (so the check above tests it)
    layers = model.attention_layers()
    saved = [a.sliding_window for a in layers]
    try:
        for a in layers:
            a.sliding_window = None
        full = last_logits(model, long_ids, 32)
    finally:
        for a, w in zip(layers, saved):
            a.sliding_window = w
    off = (full - ref).abs().max().item()
    print(f"long prompt with the windows off: max |logit diff| {off:.2e}")
    assert off > 100 * ATOL


def run_greedy(llm, prompts: list[list[int]], n: int, **options) -> tuple[list[list[int]], list, LLMEngine]:
    """Each prompt through a fresh engine over the loaded model, one after another (a later one may hit the
    prefix cache of an earlier one)."""
    config = EngineConfig(num_kv_blocks=160, block_size=16, **options)
    engine = LLMEngine(llm.loaded.model, llm.tokenizer, llm.loaded.eos_token_ids, config)
    tokens, metrics = [], []
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    tokens.append(list(out.outputs[0].token_ids))
                    metrics.append(out.metrics)
    return tokens, metrics, engine


def test_chunked_prefill_and_prefix_cache_across_the_window(llm, long_ids):
    """The 600-token prompt prefilled whole, in 96-token chunks (one spans position 512), and a second prompt
    sharing its first 560 tokens served from the prefix cache: the same greedy tokens (decoded past 512)."""
    shared = 560
    other = long_ids[:shared] + long_ids[1:41]  # then goes elsewhere
    whole, _, _ = run_greedy(llm, [long_ids, other], 4, enable_chunked_prefill=False, max_num_batched_tokens=1024,
                             enable_prefix_caching=False)
    chunked, _, engine = run_greedy(llm, [long_ids], 4, enable_chunked_prefill=True, max_num_batched_tokens=96,
                                    enable_prefix_caching=False)
    assert len(engine.trace) == 7 + 3  # 7 prefill chunks (the first token comes with the last), 3 decodes
    assert chunked[0] == whole[0]
    cached, metrics, _ = run_greedy(llm, [long_ids, other], 4, enable_prefix_caching=True)
    assert metrics[1].num_cached_tokens == shared // 16 * 16  # every full block of the shared tokens
    assert cached == whole


# ---------------------------------------------------------------- tiny random models (no download)


def tiny_hf_config(**overrides):
    from transformers import Gemma3TextConfig

    kw = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, max_position_embeddings=256, sliding_window=8,
              sliding_window_pattern=2, query_pre_attn_scalar=24, initializer_range=0.2, rope_theta=1e6,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return Gemma3TextConfig(**{**kw, **overrides})


def save_tiny_gemma3(folder):
    """A random Gemma 3 (window 8, layers local/global alternating, random norms) saved as an HF folder;
    returns the transformers model."""
    from transformers import AutoModelForCausalLM

    from tests.helpers.tiny_tokenizer import make_tiny_tokenizer

    torch.manual_seed(0)
    hf_model = AutoModelForCausalLM.from_config(tiny_hf_config(final_logit_softcapping=6.0), dtype=torch.float32)
    with torch.no_grad():  # transformers starts Gemma norms at 0 (scale 1): randomise them so a mis-map shows
        for name, p in hf_model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
    hf_model.eval().save_pretrained(folder)
    make_tiny_tokenizer().save_pretrained(folder)
    return hf_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from minillm.loader import load_model

    folder = tmp_path_factory.mktemp("gemma3") / "tiny-gemma3"
    return save_tiny_gemma3(folder), load_model(str(folder))


def test_tiny_hf_folder_matches_transformers(tiny):
    hf_model, loaded = tiny
    cfg = loaded.config
    assert cfg.model_type == "gemma3" and cfg.final_logit_softcapping == 6.0
    assert cfg.layer_types == ["sliding_attention", "full_attention"] * 2 and cfg.sliding_window == 8
    gen = torch.Generator().manual_seed(1)
    for n in (5, 40):  # inside and well past the window
        ids = torch.randint(3, 320, (n,), generator=gen).tolist()
        ours, ref = forward_logits(loaded.model, ids), hf_logits(hf_model, ids)
        diff = (ours - ref).abs().max().item()
        print(f"tiny, {n} tokens: max |logit diff| {diff:.2e}")
        assert diff < TINY_ATOL, f"{n} tokens: max |logit diff| {diff:.2e}"
    assert ref.abs().max() < 6.0  # the softcap bounds them


def test_tiny_triton_backend_equals_torch_backend(tiny):
    """Whole forward, and an engine run (chunked prefill, prefix cache, decode) past the window of 8."""
    _, loaded = tiny
    model = loaded.model
    ids = torch.randint(3, 320, (45,), generator=torch.Generator().manual_seed(2)).tolist()
    ref = forward_logits(model, ids)
    out = forward_logits(model, ids, backend=TritonAttentionBackend())
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    prompts = [ids[:30], ids[:20] + ids[30:]]  # the second shares 16 tokens (one block) with the first
    results = {}
    for backend in ("torch", "triton"):
        config = EngineConfig(num_kv_blocks=32, block_size=16, max_num_batched_tokens=12, attention_backend=backend)
        engine = LLMEngine(model, None, [], config)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True,
                                                          logprobs=0))
        done = {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    done[o.request_id] = o.outputs[0]
        results[backend] = done
    for rid in ("r0", "r1"):
        t, tr = results["torch"][rid], results["triton"][rid]
        assert t.token_ids == tr.token_ids
        for a, b in zip(t.logprobs, tr.logprobs):
            assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-4 for k in a)


def test_gemma3_config_rejects_what_it_cannot_run():
    d = tiny_hf_config().to_dict()
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        ModelConfig.from_hf_dict({**d, "attn_logit_softcapping": 50.0})
    with pytest.raises(ValueError, match="sliding_window"):
        ModelConfig.from_hf_dict({**d, "sliding_window": None})
