"""What the engine hands back for each request."""
from __future__ import annotations

from dataclasses import dataclass, field

# The one definition of the per-request latency metrics, used by the live RequestMetrics below and by
# the trace-derived timelines (metrics/from_trace.py), so the two never disagree on what they mean.


def ttft(arrival_time: float, first_token_time: float | None) -> float | None:
    """Time to first token, in seconds: from the request's arrival to its first output token.

    Includes queueing and the whole prefill. None while no token has been produced.
    """
    return None if first_token_time is None else first_token_time - arrival_time


def tpot(first_token_time: float | None, last_token_time: float | None, num_tokens: int) -> float | None:
    """Time per output token, in seconds: the mean gap between output tokens after the first.

    ``(last_token_time - first_token_time) / (num_tokens - 1)``, where ``num_tokens``
    counts every output token including the first, i.e. the mean inter-token
    latency of the decode phase (the first token's wait is TTFT's, not TPOT's).
    None when it is undefined: fewer than two tokens, or a time missing.
    """
    if first_token_time is None or last_token_time is None or num_tokens < 2:
        return None
    return (last_token_time - first_token_time) / (num_tokens - 1)


def e2e_latency(arrival_time: float, finish_time: float | None) -> float | None:
    """End-to-end latency, in seconds: from arrival to the request's last token (None while running)."""
    return None if finish_time is None else finish_time - arrival_time


def queue_time(arrival_time: float, first_scheduled_time: float | None) -> float | None:
    """Time spent waiting, in seconds: from arrival to the first step that scheduled it."""
    return None if first_scheduled_time is None else first_scheduled_time - arrival_time


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    logprobs: list[dict[int, float]] | None = None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        """Time to first token: arrival -> first output token."""
        return ttft(self.arrival_time, self.first_token_time)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (mean inter-token latency)."""
        return tpot(self.first_token_time, self.last_token_time, self.num_generated_tokens)

    @property
    def e2e_latency(self) -> float | None:
        return e2e_latency(self.arrival_time, self.finish_time)

    @property
    def queue_time(self) -> float | None:
        return queue_time(self.arrival_time, self.first_scheduled_time)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    metrics: RequestMetrics | None = None
