"""Load a separate draft model for speculative decoding and check that it can draft for the target.

The draft's token ids must mean what the target's mean: the same vocabulary
width, and (when both come with tokenizers) the same token -> id map. It is
loaded like the target (dtype, device) and, by default, quantized the same
way (`quantization="auto"`), so a GGUF target's draft also computes on its
file's own blocks.
"""
from __future__ import annotations

import torch

from minillm.models.llama import LlamaForCausalLM
from minillm.spec_decode.speculative_config import SpeculativeConfig


def load_draft(cfg: SpeculativeConfig, runner, engine_config, tokenizer=None) -> LlamaForCausalLM:
    """The draft model, loaded and quantized, after the tokenizer check (ValueError when they differ)."""
    target = runner.model
    if isinstance(cfg.model, torch.nn.Module):  # already loaded (tests, notebooks): used as given
        draft = cfg.model
        _check_vocab(draft, target, str(type(draft).__name__))
        return _restrict(draft, cfg, tokenizer).eval()
    from minillm.loader import load_model

    dtype = target.embed_tokens.weight.dtype
    loaded = load_model(cfg.model, dtype=dtype, device=runner.device)
    _check_vocab(loaded.model, target, cfg.model)
    if tokenizer is not None and loaded.tokenizer is not None:
        _check_tokenizer(loaded.tokenizer, tokenizer, cfg.model)
    method = engine_config.quantization if cfg.quantization == "auto" else cfg.quantization
    if method == "gguf" and not str(loaded.source).lower().endswith(".gguf"):
        method = None  # the target keeps its GGUF blocks; a float draft folder has none to keep
    if method is not None:
        from minillm.quant.apply import quantize_loaded

        quantize_loaded(loaded, method, engine_config.quantization_group_size if cfg.quantization == "auto" else None,
                        lm_head=engine_config.quantize_lm_head)
    return _restrict(loaded.model, cfg, tokenizer if tokenizer is not None else loaded.tokenizer).eval()


def _restrict(draft: LlamaForCausalLM, cfg: SpeculativeConfig, tokenizer) -> LlamaForCausalLM:
    """With draft_vocab: the draft's LM head keeps that many most frequent tokens (draft_vocab.py)."""
    if cfg.draft_vocab is None:
        return draft
    from minillm.spec_decode.draft_vocab import kept_tokens, restrict_lm_head

    restrict_lm_head(draft, kept_tokens(tokenizer, draft.config.vocab_size, cfg.draft_vocab))
    return draft


def _check_vocab(draft: LlamaForCausalLM, target: LlamaForCausalLM, name: str) -> None:
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft model {name!r} has a vocabulary of {draft.config.vocab_size} ids, the target "
                         f"{target.config.vocab_size}: a draft must share the target's tokenizer")


def _check_tokenizer(draft_tok, target_tok, name: str) -> None:
    a, b = draft_tok.get_vocab(), target_tok.get_vocab()
    if a != b:
        differ = sorted(set(a.items()) ^ set(b.items()))[:3]
        raise ValueError(f"draft model {name!r} has a different tokenizer from the target "
                         f"({len(a)} vs {len(b)} tokens; e.g. {differ}): its token ids would mean other text")
