"""`speculative={...}` parsed into a SpeculativeConfig, with a clear error for every bad key or value."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

METHODS = ("ngram", "draft", "medusa", "hydra", "eagle")
HEAD_METHODS = ("medusa", "hydra")  # trained heads on the target's own hidden state
# trained drafts that read the target's hidden states: Medusa's and Hydra's heads, EAGLE's layer
FEATURE_METHODS = HEAD_METHODS + ("eagle",)
DRAFT_MODELS = ("int4", "int8", "self")
MAX_NUM_TOKENS = 16
MAX_TREE_NODES = 64


@dataclass
class SpeculativeConfig:
    """method: "ngram" (prompt lookup), "draft" (a cheaper model proposes), "medusa" (heads on the
      target's hidden state, spec_decode/medusa.py) or "hydra" (heads that also read the tokens
      guessed before them, spec_decode/hydra.py) or "eagle" (one decoder layer on the target's
      features that reads the context through a KV cache of its own, spec_decode/eagle.py).

    num_tokens (k): tokens proposed per step and sequence; the verify step scores k + 1.
    ngram_max / ngram_min: longest / shortest suffix n-gram searched for in the sequence.
    model (draft), built from the target, sharing its shapes and KV pool (spec_decode/draft.py):
      "int4" (default) or "int8": a weight-quantized copy of the target;
      "self": the target's own first `num_layers` layers (early exit).
    model (draft), a separate smaller model with the target's tokenizer and a KV pool of its own
      (spec_decode/draft_model.py): a registered name ("qwen2.5-coder-0.5b"), a folder, a .gguf
      file, a Hub id, or a loaded LlamaForCausalLM.
    num_layers (draft built from the target): run only its first num_layers layers (required for "self").
    quantization (separate draft): "auto" (default: the target's quantization), None, or a method.
    num_kv_blocks (separate draft): its pool's blocks (default: as many as the target's pool).
    draft_vocab (separate draft): its LM head scores only this many most frequent tokens
      (spec_decode/draft_vocab.py; default None: the whole vocabulary). Output is unchanged.
      (medusa, hydra): the heads' guesses are ranked on a copy of those rows of the target's LM head;
      the target's own logits stay whole.
    compile (separate draft): torch.compile the draft's decode forwards (default None: as the engine).
      A verify scores k + 1 rows per sequence, which the compiled decode step does not take, so a
      compiled target gains little there; the draft's k - 1 guesses are single-row decodes, where
      compiling removes the small model's per-op overhead.
    heads (eagle, required): a layer file from `minillm train-eagle`, or an EagleLayer module (none
      ships: README); any num_tokens (the layer runs once more per guess).
    heads (medusa, hydra): a heads file from `minillm train-medusa [--kind hydra]`, or a MedusaHeads /
      HydraHeads module (default: the heads shipped for the default model); num_tokens <= its heads.
    prompt_lookup_min (separate draft): look the next tokens up in the sequence itself first (prompt
      lookup, ngram.py: the latest earlier occurrence of its last ngram_max .. prompt_lookup_min tokens)
      and run the draft model only for sequences where that finds nothing (spec_decode/lookup_first.py).
      Text that copies its context then costs no draft forward. Default None: the draft always proposes.
    tree (medusa, hydra): verify a tree of candidates instead of a chain of top-1 guesses (spec_decode/tree.py):
      widths per depth ([3, 2, 1]: head 1's top-3, under each head 2's top-2, then head 3's top-1)
      or Medusa-style rank paths ([[0], [1], [0, 0]]). num_tokens becomes the tree's depth;
      each step reserves one KV slot per node.
    """

    method: str
    num_tokens: int = 4
    ngram_max: int = 4
    ngram_min: int = 1
    model: Any = None
    num_layers: int | None = None
    quantization: str | None = "auto"
    num_kv_blocks: int | None = None
    draft_vocab: int | None = None
    compile: bool | None = None
    heads: Any = None
    tree: Any = None
    prompt_lookup_min: int | None = None

    @property
    def tree_template(self):
        from minillm.spec_decode.tree import TreeTemplate

        return None if self.tree is None else TreeTemplate.from_spec(self.tree)

    @property
    def num_lookahead_slots(self) -> int:
        """KV slots (and batch rows) a verifying sequence reserves: k for a chain, the nodes of a tree."""
        return self.num_tokens if self.tree is None else self.tree_template.num_nodes

    @property
    def builds_from_target(self) -> bool:
        """A draft made from the target's own weights (shares its pool), not a separate model."""
        return self.method == "draft" and isinstance(self.model, str) and self.model in DRAFT_MODELS

    def with_num_tokens(self, k: int) -> "SpeculativeConfig":
        """The same config proposing k tokens per step (validated)."""
        if self.tree is not None:
            raise ValueError("a tree's depth sets num_tokens; change the tree instead")
        cfg = replace(self, num_tokens=k)
        cfg.validate()
        return cfg

    def validate(self, num_target_layers: int | None = None) -> None:
        def bad(msg: str) -> None:
            raise ValueError(f"invalid speculative config: {msg}")

        if self.method not in METHODS:
            bad(f"method must be one of {METHODS}, got {self.method!r}")
        if not isinstance(self.num_tokens, int) or not (1 <= self.num_tokens <= MAX_NUM_TOKENS):
            bad(f"num_tokens must be an integer in [1, {MAX_NUM_TOKENS}], got {self.num_tokens!r}")
        if self.draft_vocab is not None and not (self.method in FEATURE_METHODS or
                                                 (self.method == "draft" and not self.builds_from_target)):
            bad("draft_vocab applies to a separate draft model (method 'draft' with a model name, path or module) "
                "or to Medusa's, Hydra's or EAGLE's guesses")
        if self.draft_vocab is not None and (not isinstance(self.draft_vocab, int) or self.draft_vocab < 1):
            bad(f"draft_vocab must be an integer >= 1, got {self.draft_vocab!r}")
        if self.compile is not None and (self.method != "draft" or self.builds_from_target):
            bad("compile applies to a separate draft model (method 'draft' with a model name, path or module); "
                "a draft built from the target runs in the target's forward")
        if self.compile is not None and not isinstance(self.compile, bool):
            bad(f"compile must be True, False or None (as the engine), got {self.compile!r}")
        if self.prompt_lookup_min is not None:
            if self.method != "draft" or self.builds_from_target:
                bad("prompt_lookup_min applies to a separate draft model (method 'draft' with a model name, path or "
                    "module); method 'ngram' is prompt lookup alone")
            if (not isinstance(self.prompt_lookup_min, int) or isinstance(self.prompt_lookup_min, bool)
                    or not 1 <= self.prompt_lookup_min <= self.ngram_max):
                bad(f"prompt_lookup_min must be an integer in [1, ngram_max={self.ngram_max}], "
                    f"got {self.prompt_lookup_min!r}")
        if self.tree is not None and self.method not in HEAD_METHODS:
            bad(f"tree applies to methods {HEAD_METHODS} (their heads rank several candidates per position), "
                f"not {self.method!r}")
        if self.method == "ngram":
            for name in ("ngram_min", "ngram_max"):
                v = getattr(self, name)
                if not isinstance(v, int) or v < 1:
                    bad(f"{name} must be an integer >= 1, got {v!r}")
            if self.ngram_min > self.ngram_max:
                bad(f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})")
        elif self.method in FEATURE_METHODS:
            if self.method == "eagle" and self.heads is None:
                bad("method 'eagle' needs heads: a layer file from `minillm train-eagle` or an EagleLayer "
                    "(no layer ships with minillm)")
            if self.heads is not None and not isinstance(self.heads, (str, torch.nn.Module)):
                bad(f"heads must be a path to a heads (or EAGLE layer) file or a MedusaHeads / HydraHeads / "
                    f"EagleLayer module, "
                    f"got {type(self.heads).__name__}")
            if self.tree is not None:
                try:
                    template = self.tree_template
                except ValueError as e:
                    bad(str(e))
                if template.num_nodes > MAX_TREE_NODES:
                    bad(f"a tree of {template.num_nodes} nodes; at most {MAX_TREE_NODES}")
                self.num_tokens = template.depth
        else:
            if self.model is None:
                self.model = "int4"
            if isinstance(self.model, str):
                if not self.model.strip():
                    bad(f"draft model must be one of {DRAFT_MODELS} or a model name / path, got {self.model!r}")
            elif not isinstance(self.model, torch.nn.Module):
                bad(f"draft model must be one of {DRAFT_MODELS}, a model name / path or a loaded model, "
                    f"got {type(self.model).__name__}")
            if not self.builds_from_target:
                if self.num_layers is not None:
                    bad("num_layers applies to drafts built from the target (int4, int8, self), "
                        "not to a separate draft model")
                if self.quantization not in ("auto", None):
                    from minillm.quant.methods import check_llm_options

                    try:
                        check_llm_options(self.quantization, None)
                    except ValueError as e:
                        bad(f"draft quantization: {e}")
                if self.num_kv_blocks is not None and (not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 1):
                    bad(f"num_kv_blocks must be an integer >= 1, got {self.num_kv_blocks!r}")
            if self.model == "self" and self.num_layers is None:
                bad("draft model='self' needs num_layers (how many of the target's first layers to run)")
            if self.num_layers is not None:
                if not isinstance(self.num_layers, int) or self.num_layers < 1:
                    bad(f"num_layers must be an integer >= 1, got {self.num_layers!r}")
                if num_target_layers is not None and self.num_layers > num_target_layers:
                    bad(f"num_layers ({self.num_layers}) exceeds the target's {num_target_layers} layers")
                if num_target_layers is not None and self.model == "self" and self.num_layers == num_target_layers:
                    bad(f"model='self' with all {num_target_layers} layers is the target itself; use fewer")


def parse_speculative(spec: SpeculativeConfig | dict[str, Any] | None) -> SpeculativeConfig | None:
    """None stays None; a dict's keys must be SpeculativeConfig fields."""
    if spec is None or isinstance(spec, SpeculativeConfig):
        if spec is not None:
            spec.validate()
        return spec
    if not isinstance(spec, dict):
        raise ValueError(f"speculative must be a dict like {{'method': 'ngram', 'num_tokens': 4}}, got {type(spec).__name__}")
    known = {f.name for f in fields(SpeculativeConfig)}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ValueError(f"invalid speculative config: unknown key(s) {unknown}; known: {sorted(known)}")
    if "method" not in spec:
        raise ValueError(f"invalid speculative config: 'method' is required (one of {METHODS})")
    cfg = SpeculativeConfig(**spec)
    cfg.validate()
    return cfg
