"""What every handler shares: the engine loop, the tokenizer, the model's name and the server's limits."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minillm.metrics.prometheus import TraceMetrics
from minillm.server.async_engine import AsyncEngine
from minillm.server.errors import APIError


@dataclass
class ServerState:
    engine: AsyncEngine
    # The handlers' own copy: a fast tokenizer used from two threads at once can
    # fail ("Already borrowed"), and the engine thread decodes with the original.
    tokenizer: Any | None
    model_name: str
    max_model_len: int
    max_queue_len: int
    metrics: TraceMetrics

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(404, f"The model `{name}` does not exist; this server serves `{self.model_name}`.",
                           "not_found_error", "model", "model_not_found")

    def check_capacity(self, num_requests: int) -> None:
        """Refuse new work when waiting + running requests would exceed --max-queue-len."""
        busy = self.engine.num_unfinished
        if busy + num_requests > self.max_queue_len:
            raise APIError(429, f"the server is at capacity ({busy} requests waiting or running, limit "
                           f"{self.max_queue_len}); retry later", "rate_limit_error", None, "queue_full")
