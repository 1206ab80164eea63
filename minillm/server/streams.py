"""Plumbing between engine requests and HTTP: fan-in, aborts, disconnects, server-sent events.

A request's engine work must stop as soon as nobody waits for it: every path
out of a handler (finished, client gone, error) goes through `Submitted.close`,
which aborts whatever is still running so its KV blocks are freed.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from fastapi import Request
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from minillm.engine.outputs import RequestOutput
from minillm.sampling_params import SamplingParams
from minillm.server.async_engine import AsyncEngine, RequestStream
from minillm.server.errors import bad_request, engine_error

T = TypeVar("T")
log = logging.getLogger("minillm.server")


@dataclass
class Submitted:
    """The engine requests behind one HTTP request (one per prompt)."""

    engine: AsyncEngine
    streams: list[RequestStream] = field(default_factory=list)

    async def add(self, request_id: str, ids: list[int], params: SamplingParams, priority: int = 0) -> None:
        try:
            self.streams.append(await self.engine.add_request(request_id, ids, params, priority))
        except ValueError as e:  # RequestError and friends: the client's input
            raise bad_request(str(e), "prompt" if "prompt" in str(e) else None) from e

    def close(self) -> None:
        for s in self.streams:
            if not s.finished:
                self.engine.abort(s.request_id)

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, newest output) as the engine produces them, until all finished."""
        if len(self.streams) == 1:
            async for out in self.streams[0]:
                yield 0, out
            return
        merged: asyncio.Queue[tuple[int, RequestOutput | BaseException]] = asyncio.Queue()

        async def pump(i: int, s: RequestStream) -> None:
            try:
                async for out in s:
                    merged.put_nowait((i, out))
            except Exception as e:
                merged.put_nowait((i, e))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(self.streams)]
        try:
            left = len(self.streams)
            while left:
                i, item = await merged.get()
                if isinstance(item, BaseException):
                    raise item
                yield i, item
                left -= item.finished
        finally:
            for t in tasks:
                t.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Run a non-streaming handler's work; cancel it (and so abort its requests) if the client leaves."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def sse(payload: BaseModel | str) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json()
    return f"data: {data}\n\n"


def sse_error(e: BaseException) -> str:
    """The stream's last event when its request ended without finishing (OpenAI's error body)."""
    err = engine_error(e)
    if err.type == "internal_error" and err is not e:
        log.error("a stream ended with an error", exc_info=e)
    return sse(err.body())


class SSEResponse(StreamingResponse):
    """text/event-stream that, however the response ends (done, client gone, cancelled before the
    first byte), closes its generator and then calls `on_close` -- so the engine work is aborted at once."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            finally:
                self.on_close()
