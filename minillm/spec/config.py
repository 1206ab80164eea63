"""`speculative={...}` parsed into a SpecConfig, with a clear error for every bad key or value."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

METHODS = ("ngram", "draft")
MAX_NUM_TOKENS = 16


@dataclass
class SpecConfig:
    """method: "ngram" (prompt lookup) or "draft" (the target's first `num_layers` layers).

    num_tokens (k): tokens proposed per step and sequence; the verify step scores k + 1.
    ngram_max / ngram_min: longest / shortest suffix n-gram searched for in the sequence.
    num_layers: draft depth; the draft shares the target's embedding, final norm, LM head
    and -- because its layers are the target's first layers -- their K/V cache too.
    """

    method: str
    num_tokens: int = 4
    ngram_max: int = 4
    ngram_min: int = 1
    model: str | None = None
    num_layers: int | None = None

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
            if self.model not in (None, "self"):
                # a separate draft checkpoint would need its own KV pool and the same tokenizer
                bad(f"model={self.model!r}: only the self-draft (the target's first layers) is implemented; "
                    "pass model='self' (or omit it) and num_layers")
            if not isinstance(self.num_layers, int) or self.num_layers < 1:
                bad(f"draft needs num_layers, an integer >= 1, got {self.num_layers!r}")
            if num_target_layers is not None and self.num_layers >= num_target_layers:
                bad(f"num_layers ({self.num_layers}) must be below the target's {num_target_layers} layers")


def parse_speculative(spec: SpecConfig | dict[str, Any] | None) -> SpecConfig | None:
    """None stays None; a dict's keys must be SpecConfig fields."""
    if spec is None or isinstance(spec, SpecConfig):
        if spec is not None:
            spec.validate()
        return spec
    if not isinstance(spec, dict):
        raise ValueError(f"speculative must be a dict like {{'method': 'ngram', 'num_tokens': 4}}, got {type(spec).__name__}")
    known = {f.name for f in fields(SpecConfig)}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ValueError(f"invalid speculative config: unknown key(s) {unknown}; known: {sorted(known)}")
    if "method" not in spec:
        raise ValueError(f"invalid speculative config: 'method' is required (one of {METHODS})")
    cfg = SpecConfig(**spec)
    cfg.validate()
    return cfg
