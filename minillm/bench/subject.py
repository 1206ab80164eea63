"""What a benchmarked engine must do: the same three jobs for minillm and its peers.

A subject runs one greedy request (decode speed), one long prompt with a single
output token (prefill speed), and a whole workload of requests (throughput).
Each returns plain timings; the latency and throughput modules turn them into
figures, so adding a peer (llama.cpp, vLLM) means writing one more subject.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class DecodeRun:
    """One batch-1 request of n output tokens, timed per token."""

    ttft_s: float  # request start -> first output token (the prefill of the prompt)
    decode_s: float  # first output token -> last output token
    num_output_tokens: int
    bytes_per_token: float | None = None  # analytic bytes a decode step reads, when the subject knows

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first, per second: the steady-state decode speed."""
        return (self.num_output_tokens - 1) / self.decode_s if self.decode_s > 0 else float("nan")


@dataclass
class BatchRun:
    """A whole workload served, all requests arriving at once."""

    wall_s: float
    prompt_tokens: int
    output_tokens: int  # the tokens the requests asked for
    generated_tokens: int  # tokens the engine computed, incl. padding waste (peers with static batches)
    ttft_s: list[float] = field(default_factory=list)  # per request
    tpot_s: list[float] = field(default_factory=list)  # per request with >= 2 output tokens
    num_steps: int | None = None
    flops: float | None = None  # the engine's analytic FLOPs over the run (its trace), when the subject counts them


class Subject(Protocol):
    name: str

    def decode(self, prompt_ids: list[int], max_tokens: int) -> DecodeRun: ...

    def prefill(self, prompt_ids: list[int]) -> float: ...

    def serve(self, prompts: list[list[int]], output_lens: list[int]) -> BatchRun: ...
