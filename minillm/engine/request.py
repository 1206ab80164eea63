"""A request: validated once at the door, then n sequences inside the engine, then one RequestOutput.

Everything a request could get wrong is checked here, before it is queued, so
a bad request gets a clear RequestError and the engine loop never sees it: an
empty prompt, token ids outside the vocabulary, a prompt over the context
length, a prompt (plus max_tokens) that can never fit the KV pool, a priority that is not an integer.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from minillm.engine.detokenizer import IncrementalDetokenizer
from minillm.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from minillm.engine.sequence import Sequence
from minillm.sampling_params import SamplingParams


class RequestError(ValueError):
    """A request the engine refuses up front (it never enters the queue)."""


def encode_text(tokenizer, text: str, add_special_tokens: bool | None = None) -> list[int]:
    """A text prompt's token ids, with the special tokens its tokenizer adds (vLLM's rule for completions).

    None follows the tokenizer: Gemma and Llama put BOS first, Qwen and SmolLM2 add nothing. A chat
    prompt rendered by its template already holds its BOS as text, so chat passes False.
    """
    if not text:
        return []
    return tokenizer.encode(text, add_special_tokens=add_special_tokens is not False)


def check_priority(priority: object, request_id: str | None = None) -> None:
    """A request's priority is a plain integer (any sign; lower is served first)."""
    if not isinstance(priority, int) or isinstance(priority, bool):
        who = f"request {request_id!r}: " if request_id is not None else ""
        raise RequestError(f"{who}priority must be an integer (lower is served first), got {priority!r}")


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival_time: float
    priority: int = 0  # lower is served first under scheduling_policy="priority" (vLLM's meaning)

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    def output(self) -> RequestOutput:
        """The request as a client sees it now (text never ahead of what a stop string may cut)."""
        first = self.seqs[0]
        done = self.finished
        outs = [
            CompletionOutput(
                s.index, s.visible_text(), list(s.output_token_ids), s.finish_reason, s.stop_reason,
                list(s.logprobs) if s.params.logprobs is not None else None,
            )
            for s in self.seqs
        ]
        firsts = [s.first_token_time for s in self.seqs if s.first_token_time is not None]
        metrics = RequestMetrics(
            arrival_time=self.arrival_time,
            first_scheduled_time=first.first_scheduled_time,
            first_token_time=min(firsts) if firsts else None,
            last_token_time=first.last_token_time,
            finish_time=max((s.finish_time or 0.0) for s in self.seqs) if done else None,
            num_generated_tokens=first.num_output_tokens,
            num_cached_tokens=first.num_cached_tokens,
            num_preemptions=sum(s.num_preemptions for s in self.seqs),
        )
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outs, done, metrics)


@dataclass
class RequestBuilder:
    """Checks a prompt against the model and the pool, and makes its sequences."""

    tokenizer: object | None
    vocab_size: int
    max_model_len: int
    pool_tokens: int  # blocks x block_size
    device: torch.device

    def __post_init__(self) -> None:
        self._seq_ids = itertools.count()

    def build(self, request_id: str, prompt: str | list[int], params: SamplingParams, now: float,
              priority: int = 0) -> Request:
        params.validate()
        check_priority(priority, request_id)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this engine has no tokenizer: pass prompt token ids")
            text, ids = prompt, encode_text(self.tokenizer, prompt, params.add_special_tokens)
        else:
            text, ids = None, list(prompt)
        if not ids:
            raise RequestError(f"request {request_id!r}: the prompt is empty")
        if any(not (0 <= t < self.vocab_size) for t in ids):
            raise RequestError(f"request {request_id!r}: prompt token ids must be in [0, {self.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise RequestError(
                f"request {request_id!r}: prompt has {len(ids)} tokens but the context length is "
                f"{self.max_model_len} (prompt plus at least one generated token must fit)"
            )
        room = min(self.max_model_len, self.pool_tokens) - len(ids)
        if room < 1:
            raise RequestError(
                f"request {request_id!r}: prompt of {len(ids)} tokens can never fit the KV pool "
                f"of {self.pool_tokens} tokens"
            )
        if params.max_tokens is not None and len(ids) + params.max_tokens > self.pool_tokens:
            raise RequestError(
                f"request {request_id!r}: prompt ({len(ids)}) + max_tokens ({params.max_tokens}) can never fit "
                f"the KV pool of {self.pool_tokens} tokens; lower max_tokens or raise the KV cache budget"
            )
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        seqs: list[Sequence] = []
        for i in range(params.n):
            gen = None
            if params.seed is not None:
                gen = torch.Generator(device=self.device).manual_seed((params.seed + i) % 2**64)  # as torch reads it
            detok = IncrementalDetokenizer(self.tokenizer, ids, params) if self.tokenizer is not None else None
            seq = Sequence(next(self._seq_ids), request_id, i, list(ids), len(ids), params, now,
                           max_tokens=max_tokens, priority=priority, generator=gen, detokenizer=detok)
            if i > 0:
                seq.wait_for_parent = seqs[0]
            seqs.append(seq)
        return Request(request_id, text, list(ids), params, seqs, now, priority)
