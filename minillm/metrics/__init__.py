"""Serving metrics: from the step trace (from_trace) and for Prometheus (prometheus); TTFT and TPOT
are defined once, in minillm/engine/outputs.py. The names below are imported on first use."""
__all__ = ["RequestTimeline", "TraceSummary", "request_timelines", "summarize"]


def __getattr__(name: str):
    if name in __all__:
        from minillm.metrics import from_trace

        return getattr(from_trace, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
