"""Speculative decoding inside continuous batching.

A cheap proposer guesses the next k tokens of each decoding sequence; the
target model scores all k + 1 positions in one forward; rejection sampling
keeps the longest prefix the target agrees with (plus one token of its own),
so the output distribution is exactly the target's.

    LLM(speculative={"method": "ngram", "num_tokens": 4})
    LLM(speculative={"method": "draft", "model": "int4", "num_tokens": 4})
    LLM(speculative={"method": "draft", "model": "self", "num_layers": 24, "num_tokens": 2})

It plugs into the engine's one step: the scheduler reserves lookahead slots,
the proposer (proposer.py) puts drafts on the batch, the executor runs them
with everything else, engine/token_choice.py verifies them (rejection.py) and
the scheduler's update rolls back the slots of rejected drafts.
"""
from minillm.spec_decode.speculative_config import SpeculativeConfig, parse_speculative

__all__ = ["SpeculativeConfig", "parse_speculative", "verify_tokens"]


def __getattr__(name: str):
    if name == "verify_tokens":  # on first use: the engine imports the verifier where it verifies
        from minillm.spec_decode.rejection import verify_tokens

        return verify_tokens
    raise AttributeError(f"module 'minillm.spec_decode' has no attribute {name!r}")
