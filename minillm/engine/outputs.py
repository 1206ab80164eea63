"""What the engine hands back for each request."""
from __future__ import annotations

from dataclasses import dataclass, field

from minillm.metrics import latency as _latency


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
        return _latency.ttft(self.arrival_time, self.first_token_time)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (mean inter-token latency)."""
        return _latency.tpot(self.first_token_time, self.last_token_time, self.num_generated_tokens)

    @property
    def e2e_latency(self) -> float | None:
        return _latency.e2e_latency(self.arrival_time, self.finish_time)

    @property
    def queue_time(self) -> float | None:
        return _latency.queue_time(self.arrival_time, self.first_scheduled_time)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    metrics: RequestMetrics | None = None
