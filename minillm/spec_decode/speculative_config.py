"""`speculative={...}` parsed into a SpeculativeConfig, with a clear error for every bad key or value."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

METHODS = ("ngram", "draft")
DRAFT_MODELS = ("int4", "int8", "self")
MAX_NUM_TOKENS = 16


@dataclass
class SpeculativeConfig:
    """method: "ngram" (prompt lookup) or "draft" (a cheaper model built from the target).

    num_tokens (k): tokens proposed per step and sequence; the verify step scores k + 1.
    ngram_max / ngram_min: longest / shortest suffix n-gram searched for in the sequence.
    model (draft): "int4" (default) or "int8": a weight-quantized copy of the target;
    "self": the target's own first `num_layers` layers (early exit).
    num_layers (draft): run only the draft's first num_layers layers (required for "self").
    Every draft has the target's shapes and shares its KV pool (see minillm/spec_decode/draft.py).
    """

    method: str
    num_tokens: int = 4
    ngram_max: int = 4
    ngram_min: int = 1
    model: str | None = None
    num_layers: int | None = None

    def with_num_tokens(self, k: int) -> "SpeculativeConfig":
        """The same config proposing k tokens per step (validated)."""
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
        if self.method == "ngram":
            for name in ("ngram_min", "ngram_max"):
                v = getattr(self, name)
                if not isinstance(v, int) or v < 1:
                    bad(f"{name} must be an integer >= 1, got {v!r}")
            if self.ngram_min > self.ngram_max:
                bad(f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})")
        else:
            if self.model is None:
                self.model = "int4"
            if self.model not in DRAFT_MODELS:
                # a separate checkpoint would need its own KV pool and the same tokenizer: not implemented
                bad(f"draft model must be one of {DRAFT_MODELS} (drafts built from the target), got {self.model!r}")
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
