"""A sequence: one completion being generated, and the bookkeeping the scheduler needs.

After each step the scheduler appends the chosen tokens here (`append_token`),
which also decides whether the sequence is done: an EOS or stop token, a stop
string (found by the incremental detokenizer), max_tokens, or the context length.
"""
from __future__ import annotations

import enum
from typing import Any
from dataclasses import dataclass, field

import torch

from minillm.engine.detokenizer import IncrementalDetokenizer
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
    max_tokens: int = 2**31  # effective output limit: params.max_tokens clipped to the context and the pool
    priority: int = 0  # the request's (vLLM's field): lower is served first under scheduling_policy="priority"
    status: SequenceStatus = SequenceStatus.WAITING
    # Tokens whose K/V are in the cache. The scheduler gives each step a chunk
    # that brings this closer to len(token_ids): a prefill chunk, or 1 decode token.
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes | int] = field(default_factory=list)  # hash chain of full, registered blocks
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    detokenizer: IncrementalDetokenizer | None = None  # None: no tokenizer, token ids only
    logprobs: list[dict[int, float]] = field(default_factory=list)
    generator: torch.Generator | None = None
    wait_for_parent: "Sequence | None" = None  # n > 1: start once the parent's prompt is cached
    grammar: Any = None  # structured outputs: its grammar matcher (engine/grammar.py), once compiled

    @property
    def output_text(self) -> str:
        return self.detokenizer.text if self.detokenizer is not None else ""

    def visible_text(self) -> str:
        """What a client may see now: never text a stop string could still cut (see detokenizer.py)."""
        if self.detokenizer is None:
            return ""
        return self.detokenizer.visible_text(self.is_finished)

    def append_token(self, token: int, logprob: dict[int, float] | None, now: float,
                     eos_token_ids: set[int], max_model_len: int) -> str | None:
        """Append one generated token; returns the finish reason ("stop" / "length") or None."""
        self.token_ids.append(token)
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now
        if logprob is not None:
            self.logprobs.append(logprob)
        p = self.params
        stop_string = self.detokenizer.append(token) if self.detokenizer is not None else None
        # before min_tokens the sampler bans EOS and stop ids (sampler.min_tokens_bans)
        if self.num_output_tokens >= p.min_tokens and (
                (not p.ignore_eos and token in eos_token_ids) or token in p.stop_token_ids):
            self.stop_reason = token
            return "stop"
        if stop_string is not None:
            self.stop_reason = stop_string
            return "stop"
        if self.num_output_tokens >= self.max_tokens or self.num_tokens >= max_model_len:
            return "length"
        return None

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
