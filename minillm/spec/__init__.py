"""Speculative decoding inside continuous batching.

A cheap proposer guesses the next k tokens of each decoding sequence; the
target model scores all k + 1 positions in one forward; rejection sampling
keeps the longest prefix the target agrees with (plus one token of its own),
so the output distribution is exactly the target's.

    LLM(speculative={"method": "ngram", "num_tokens": 4})
    LLM(speculative={"method": "draft", "model": "int4", "num_tokens": 4})
    LLM(speculative={"method": "draft", "model": "self", "num_layers": 24, "num_tokens": 2})
"""
from minillm.spec.config import SpecConfig, parse_speculative
from minillm.spec.rejection import verify_tokens

__all__ = ["SpecConfig", "parse_speculative", "verify_tokens"]
