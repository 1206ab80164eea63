"""Serving metrics: from the step trace (from_trace), for Prometheus (prometheus), and the
TTFT / TPOT definitions both use (latency).

The names below are imported on first use, so that ``import minillm.metrics.latency``
(done by the engine's outputs module) stays cheap and pulls in neither the trace
summaries nor the roofline code.
"""
__all__ = ["RequestTimeline", "TraceSummary", "request_timelines", "summarize"]


def __getattr__(name: str):
    if name in __all__:
        from minillm.metrics import from_trace

        return getattr(from_trace, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
