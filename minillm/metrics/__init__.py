from minillm.metrics.from_trace import RequestTimeline, TraceSummary, request_timelines, summarize

__all__ = ["RequestTimeline", "TraceSummary", "request_timelines", "summarize"]
