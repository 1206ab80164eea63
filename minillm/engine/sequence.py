"""A sequence: one completion being generated, and the bookkeeping the scheduler needs."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from minillm.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to be recomputed
    RUNNING = "running"  # holds KV blocks and is scheduled every step
    FINISHED = "finished"


@dataclass
class Sequence:
    seq_id: int
    request_id: str
    index: int  # which of the request's n completions
    token_ids: list[int]  # prompt followed by the output so far
    num_prompt_tokens: int
    params: SamplingParams
    arrival_time: float
    status: SequenceStatus = SequenceStatus.WAITING
    # Tokens whose K/V are in the cache. The scheduler gives each step a chunk
    # that brings this closer to len(token_ids): a prefill chunk, or 1 decode token.
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # hash chain of full, registered blocks
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    output_text: str = ""
    logprobs: list[dict[int, float]] = field(default_factory=list)
    generator: torch.Generator | None = None
    wait_for_parent: "Sequence | None" = None  # n > 1: start once the parent's prompt is cached

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens
