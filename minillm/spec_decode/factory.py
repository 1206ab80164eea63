"""make_proposer: the proposer a SpeculativeConfig asks for, built for the target's runner.

Above every proposer (ngram.py, draft.py, draft_model.py, lookup_first.py, medusa.py, hydra.py,
eagle.py), each of which implements proposer.Proposer; the engine calls make_proposer once, at start-up.
"""
from __future__ import annotations

from minillm.spec_decode.proposer import Proposer
from minillm.spec_decode.speculative_config import SpeculativeConfig


def make_proposer(cfg: SpeculativeConfig, runner, engine_config=None, tokenizer=None) -> Proposer:
    """runner: the target's ModelRunner (a draft built from the target reads and writes its KV pool).

    A separate draft model (cfg.model a name, path or model) is loaded with the target's dtype,
    device and quantization and gets a pool of its own (spec_decode/draft_model.py).
    """
    if cfg.method == "ngram":
        from minillm.spec_decode.ngram import NgramProposer

        return NgramProposer(cfg.ngram_max, cfg.ngram_min)
    if cfg.method in ("medusa", "hydra"):
        from minillm.engine.model_runner import ModelRunner
        from minillm.spec_decode.hydra import HydraProposer
        from minillm.spec_decode.hydra_heads import load_heads
        from minillm.spec_decode.medusa import MedusaProposer, shipped_heads_path
        from minillm.spec_decode.medusa_heads import MedusaHeads

        if not isinstance(runner, ModelRunner):
            raise ValueError(f"speculative method {cfg.method!r} reads the target's hidden states and moves its K/V, "
                             "which one process does; run it without tensor or pipeline parallelism")
        target = runner.model
        if cfg.heads is None or isinstance(cfg.heads, str):
            path = shipped_heads_path(cfg.method) if cfg.heads is None else cfg.heads
            heads = load_heads(path, target.config.hidden_size)
            check_trained_on(target, heads.metadata, f"{heads.kind} heads {path} were",
                             f"heads for this one with `minillm train-medusa --kind {cfg.method}`")
        else:
            heads = cfg.heads
        if not isinstance(heads, MedusaHeads) or heads.kind != cfg.method:
            raise ValueError(f"speculative method {cfg.method!r} needs {cfg.method} heads, got "
                             f"{getattr(heads, 'kind', type(heads).__name__)} heads")
        kind = HydraProposer if cfg.method == "hydra" else MedusaProposer
        proposer = kind(runner, heads, cfg.tree_template, ranking_head(cfg, target, tokenizer))
        proposer.check_num_tokens(cfg.num_tokens)
        proposer.set_lookahead(cfg.num_lookahead_slots)
        return proposer
    if cfg.method == "eagle":
        return make_eagle_proposer(cfg, runner, tokenizer)
    if not cfg.builds_from_target:
        from minillm.spec_decode.draft_model import DraftModelProposer
        from minillm.spec_decode.draft_loading import load_draft

        draft = load_draft(cfg, runner, engine_config, tokenizer)
        num_blocks = cfg.num_kv_blocks or runner.plan.num_blocks  # room for as many tokens as the target's
        proposer = DraftModelProposer(draft, engine_config, num_blocks, compile=cfg.compile)
        if cfg.prompt_lookup_min is None:
            return proposer
        from minillm.spec_decode.lookup_first import LookupFirstProposer
        from minillm.spec_decode.ngram import NgramProposer

        return LookupFirstProposer(NgramProposer(cfg.ngram_max, cfg.prompt_lookup_min), proposer)
    from minillm.spec_decode.draft import DraftProposer, quantized_copy

    target = runner.model
    n = target.config.num_hidden_layers
    cfg.validate(n)
    draft = target if cfg.model == "self" else quantized_copy(target, cfg.model)
    return DraftProposer(runner, draft, tuple(range(cfg.num_layers or n)))


def check_trained_on(target, metadata: dict[str, str], subject: str, remedy: str) -> None:
    """A trained draft's file names the base model it was trained on: refuse it on another one."""
    from minillm.spec_decode.medusa import embedding_fingerprint

    trained_on = metadata.get("base_fingerprint")
    if trained_on is not None and trained_on != embedding_fingerprint(target):
        raise ValueError(f"{subject} trained on another base model ({metadata.get('base_model', trained_on)}); "
                         f"train {remedy}")


def ranking_head(cfg: SpeculativeConfig, target, tokenizer):
    """With draft_vocab, a cut copy of the target's LM head that ranks a trained draft's guesses; else None."""
    if cfg.draft_vocab is None:
        return None
    from minillm.spec_decode.draft_vocab import kept_tokens, q8_0_ranking_head, restricted_head

    vocab = target.config.vocab_size
    return restricted_head(target.lm_head, kept_tokens(tokenizer, vocab, cfg.draft_vocab), vocab,
                           q8_0=q8_0_ranking_head(target.lm_head))


def make_eagle_proposer(cfg: SpeculativeConfig, runner, tokenizer) -> Proposer:
    from minillm.engine.model_runner import ModelRunner
    from minillm.spec_decode.eagle import EagleProposer
    from minillm.spec_decode.eagle_layer import EagleLayer

    if not isinstance(runner, ModelRunner):
        raise ValueError("speculative method 'eagle' reads the target's hidden states, which one process does; "
                         "run it without tensor or pipeline parallelism")
    target = runner.model
    layer = cfg.heads
    if isinstance(layer, str):
        layer = EagleLayer.load(cfg.heads, target.config)
        check_trained_on(target, layer.metadata, f"EAGLE layer {cfg.heads} was",
                         "one for this model with `minillm train-eagle`")
    if not isinstance(layer, EagleLayer):
        raise ValueError(f"speculative method 'eagle' needs an EAGLE layer, got {getattr(layer, 'kind', type(layer).__name__)}")
    return EagleProposer(runner, layer, ranking_head(cfg, target, tokenizer))
