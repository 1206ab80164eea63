"""The workloads, seeded so every run and every peer sees the same token ids.

Prompts are random token ids drawn from the ordinary part of the vocabulary
(special tokens sit at the low ids of most tokenizers). Speed does not depend
on what the tokens say, and random prompts never share a prefix, so a prefix
cache cannot make one repeat cheaper than another.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

FIRST_ORDINARY_ID = 256  # skip the special / byte tokens at the start of the vocabulary


def random_prompt(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    lo = FIRST_ORDINARY_ID if vocab_size > 2 * FIRST_ORDINARY_ID else 0
    return [rng.randrange(lo, vocab_size) for _ in range(length)]


@dataclass(frozen=True)
class LatencyWorkload:
    prompt_len: int = 32
    output_len: int = 128
    prefill_len: int = 1024
    seed: int = 0

    def decode_prompt(self, repeat: int, vocab_size: int) -> list[int]:
        return random_prompt(random.Random(f"{self.seed}-decode-{repeat}"), self.prompt_len, vocab_size)

    def prefill_prompt(self, repeat: int, vocab_size: int) -> list[int]:
        return random_prompt(random.Random(f"{self.seed}-prefill-{repeat}"), self.prefill_len, vocab_size)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "prompts": "random token ids, new ones each repeat", "sampling": "greedy, ignore_eos"}


@dataclass(frozen=True)
class ThroughputWorkload:
    num_requests: int = 128
    prompt_len_range: tuple[int, int] = (16, 256)  # inclusive, uniform
    output_len_range: tuple[int, int] = (16, 128)  # inclusive, uniform
    seed: int = 0

    def requests(self, vocab_size: int) -> tuple[list[list[int]], list[int]]:
        """(prompts, output lengths), identical for every call with the same seed."""
        rng = random.Random(f"{self.seed}-throughput")
        prompts, outs = [], []
        for _ in range(self.num_requests):
            prompts.append(random_prompt(rng, rng.randint(*self.prompt_len_range), vocab_size))
            outs.append(rng.randint(*self.output_len_range))
        return prompts, outs

    def max_tokens_per_request(self) -> int:
        return self.prompt_len_range[1] + self.output_len_range[1]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "prompts": "random token ids", "sampling": "greedy, ignore_eos",
                "arrival": "all requests at time 0"}
