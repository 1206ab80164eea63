"""The one definition of the per-request latency metrics: TTFT, TPOT, end-to-end latency, queue time.

Used both by the engine's live ``RequestMetrics`` (minillm.engine.outputs) and
by the trace-derived ``RequestTimeline`` (minillm.metrics.from_trace), so the
two can never disagree on what the numbers mean. Pure arithmetic, no imports:
importing this module must stay cheap (the engine's outputs module imports it).
"""
from __future__ import annotations


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
