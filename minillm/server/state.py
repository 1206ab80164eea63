"""What every handler shares: the engine loop, the tokenizers, the model's name and the server's limits."""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from minillm.metrics.prometheus import TraceMetrics
from minillm.server.async_engine import AsyncEngine
from minillm.server.errors import APIError
from minillm.server.limits import ServerLimits

T = TypeVar("T")

WARMING_UP, READY, DRAINING = "warming up", "ready", "draining"


@dataclass
class ServerState:
    engine: AsyncEngine
    # The handlers' own copy (logprob token strings, on the event loop): a fast tokenizer used from two
    # threads at once can fail ("Already borrowed"), and the engine thread decodes with the original.
    tokenizer: Any | None
    model_name: str
    max_model_len: int
    max_queue_len: int
    metrics: TraceMetrics
    limits: ServerLimits = field(default_factory=ServerLimits)
    # a third copy, used only on `prompt_thread`: prompts are tokenized and templated off the event
    # loop, so one long prompt never stalls the other connections
    prompt_tokenizer: Any | None = None
    token_bytes: int | None = None  # limits.longest_token_bytes(tokenizer): the no-tokenizing size check
    phase: str = WARMING_UP
    prompt_thread: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="minillm-prompts"))

    async def off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) on the prompt thread (the only user of `prompt_tokenizer`)."""
        return await asyncio.get_running_loop().run_in_executor(self.prompt_thread,
                                                                functools.partial(fn, *args, **kwargs))

    def check_admitting(self) -> None:
        """503 while the server warms up (it is not ready: /health says so) or drains for shutdown."""
        if self.phase == READY:
            return
        if self.phase == WARMING_UP:
            raise APIError(503, "the server is warming up; retry in a few seconds", "service_unavailable",
                           code="warming_up")
        raise APIError(503, "the server is shutting down and takes no new requests", "service_unavailable",
                       code="shutting_down")

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(404, f"The model `{name}` does not exist; this server serves `{self.model_name}`.",
                           "not_found_error", "model", "model_not_found")

    def check_capacity(self, sequences: int) -> None:
        """Refuse new work when the sequences waiting or running (n per request) would exceed --max-queue-len."""
        busy = self.engine.num_unfinished_sequences
        if busy + sequences > self.max_queue_len:
            raise APIError(429, f"the server is at capacity ({busy} sequences waiting or running, this request "
                           f"{sequences}, limit {self.max_queue_len}); retry later", "rate_limit_error", None,
                           "queue_full")
