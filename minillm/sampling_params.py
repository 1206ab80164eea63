"""Per-request sampling settings, validated up front so a bad value never reaches the engine loop."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # loaded when a request asks for it: the plain path never reads structured_outputs.py
    from minillm.structured_outputs import StructuredOutputs

MAX_LOGPROBS = 20


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 means greedy. top_k <= 0 and top_p == 1 and min_p == 0 disable
    those filters. `seed` makes one request reproducible whatever else is batched
    with it. `n` > 1 asks for several completions sharing the prompt's KV blocks.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # how many top alternatives to return per token (besides the sampled one)
    skip_special_tokens: bool = True
    # a text prompt's special tokens (BOS/EOS): None follows the tokenizer's own rule (Gemma, Llama add
    # BOS; Qwen, SmolLM2 add none); a chat prompt is rendered by its template, which decides: False there
    add_special_tokens: bool | None = None
    # the output must match a JSON schema, a regex, a choice or a grammar (structured_outputs.py); a dict
    # of StructuredOutputs' fields is taken too
    structured_outputs: "StructuredOutputs | None" = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.structured_outputs, dict):
            from minillm.structured_outputs import StructuredOutputs

            self.structured_outputs = StructuredOutputs.from_dict(self.structured_outputs)
        self.validate()

    def validate(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(f"invalid sampling parameter: {msg}")

        if not isinstance(self.n, int) or self.n < 1:
            bad(f"n must be an integer >= 1, got {self.n!r}")
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0.0):
            bad(f"temperature must be >= 0, got {self.temperature!r}")
        if self.temperature != self.temperature or self.temperature == float("inf"):
            bad(f"temperature must be finite, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            bad(f"top_k must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        if not (0.0 <= self.min_p <= 1.0):
            bad(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            bad(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            bad(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.logprobs is not None and not (0 <= self.logprobs <= MAX_LOGPROBS):
            bad(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not -2**63 <= self.seed < 2**64):
            bad(f"seed must be an integer in [-2**63, 2**64), got {self.seed!r}")
        if self.add_special_tokens is not None and not isinstance(self.add_special_tokens, bool):
            bad(f"add_special_tokens must be true, false or null, got {self.add_special_tokens!r}")
        if any(not s for s in self.stop):
            bad("stop strings must be non-empty")
        if self.structured_outputs is not None:
            from minillm.structured_outputs import StructuredOutputs

            if not isinstance(self.structured_outputs, StructuredOutputs):
                bad(f"structured_outputs must be a StructuredOutputs or a dict, got {self.structured_outputs!r}")
            # the grammar's end allows only EOS: a request that may not stop there could only break it
            if self.ignore_eos or self.min_tokens:
                bad("structured_outputs ends at its grammar's end: ignore_eos and min_tokens do not apply")
            self.structured_outputs.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
