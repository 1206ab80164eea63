"""AsyncEngine: one thread owns the LLMEngine; asyncio handlers talk to it through a queue.

The engine is not thread-safe, so every add_request, abort_request and step()
happens on this one thread, in the order the commands arrived:

    handler (asyncio)                      engine thread
    await add_request(id, ids, params) -->  engine.add_request  (RequestError -> back to the handler)
    async for out in stream            <--  engine.step() outputs, via loop.call_soon_threadsafe
    abort(id)  (client went away)      -->  engine.abort_request: its blocks are freed now

After each step the new StepTrace records go to the observers (the
Prometheus metrics) exactly once; older records are then dropped so a server
that runs for days does not keep every step in memory.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from minillm.engine.llm_engine import LLMEngine, RequestError
from minillm.engine.outputs import RequestOutput
from minillm.engine.trace import StepTrace
from minillm.sampling_params import SamplingParams

log = logging.getLogger("minillm.server")

TraceObserver = Callable[[Sequence[StepTrace]], None]


class EngineDeadError(RuntimeError):
    """The engine thread stopped (shut down, or a step raised): no request can make progress."""


class EngineFailedError(EngineDeadError):
    """A step raised: the requests in the engine end with this. Its message is for clients and names no
    internal detail; the exception itself is logged in full and kept in AsyncEngine.error."""


class ServerShuttingDown(EngineDeadError):
    """The server is stopping and this request did not finish within the grace period: it was aborted."""


class RequestStream:
    """The outputs of one request, delivered into the asyncio loop that asked for it.

    Each output is cumulative (all text and tokens so far), so when the client
    reads slower than the engine steps only the newest output matters.
    """

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop, sequences: int = 1) -> None:
        self.request_id = request_id
        self.loop = loop
        self.sequences = sequences  # params.n: what the request holds in the engine's batch
        self.accepted: asyncio.Future[None] = loop.create_future()
        self.finished = False
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    # --- called on the engine thread ---
    def push(self, item: RequestOutput | BaseException) -> None:
        """Hand an output (or the error that ends the stream) to the reader's loop; RuntimeError once
        that loop is closed."""
        self.loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def resolve(self, error: BaseException | None) -> None:
        """Settle `accepted`: the engine took the request (None) or refused it (the error); a no-op once
        settled or cancelled. RuntimeError once the reader's loop is closed."""
        def settle() -> None:
            if self.accepted.done():  # the handler was cancelled meanwhile
                return
            if error is None:
                self.accepted.set_result(None)
            else:
                self.accepted.set_exception(error)

        self.loop.call_soon_threadsafe(settle)

    # --- called on the asyncio loop ---
    async def next(self) -> RequestOutput:
        """The newest output (waits for one); raises EngineDeadError if the engine stopped."""
        item = await self._queue.get()
        while not self._queue.empty() and not isinstance(item, BaseException):
            item = self._queue.get_nowait()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        while not self.finished:
            yield await self.next()


@dataclass
class _Add:
    stream: RequestStream
    prompt: list[int] | str
    params: SamplingParams
    priority: int = 0


@dataclass
class _Abort:
    request_id: str


@dataclass
class _AbortAll:
    error: BaseException


_STOP = object()


class AsyncEngine:
    def __init__(self, engine: LLMEngine, observers: Sequence[TraceObserver] = (),
                 trace_window: int | None = 1024) -> None:
        self.engine = engine
        self.observers = list(observers)
        self.trace_window = trace_window  # records kept after observing (None: keep all)
        self.error: BaseException | None = None
        self._commands: queue.SimpleQueue[_Add | _Abort | object] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Lock()  # guards _streams and _closed (both threads touch them)
        self._closed = False  # set once by the engine thread as it exits
        self._thread: threading.Thread | None = None
        self._seen = len(engine.trace)  # trace records already given to observers
        self.warming_up = False  # True: steps are the server's warm-up, not traffic: their records are dropped
        self.on_failure: list[Callable[[BaseException], None]] = []  # called on the engine thread if a step raises

    # ----- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            self._commands.put(_STOP)
            self._thread.join(timeout)
            self._thread = None

    @property
    def is_healthy(self) -> bool:
        return self.error is None and self._thread is not None and self._thread.is_alive()

    @property
    def num_unfinished(self) -> int:
        """Requests accepted (or being added) and not finished yet."""
        with self._lock:
            return len(self._streams)

    @property
    def num_unfinished_sequences(self) -> int:
        """Sequences (n per request) accepted or being added and not finished: the server's queue length."""
        with self._lock:
            return sum(s.sequences for s in self._streams.values())

    # ----- asyncio side -------------------------------------------------------------------
    async def add_request(self, request_id: str, prompt: list[int] | str, params: SamplingParams,
                          priority: int = 0) -> RequestStream:
        """Queue a request; returns once the engine took it. Raises RequestError/ValueError for bad input."""
        stream = RequestStream(request_id, asyncio.get_running_loop(), params.n)
        with self._lock:
            if self._closed or self._thread is None:
                raise EngineDeadError("the engine failed" if self.error else "the engine is not running")
            if request_id in self._streams:
                raise RequestError(f"request id {request_id!r} is already in the engine")
            self._streams[request_id] = stream
        self._commands.put(_Add(stream, prompt, params, priority))
        try:
            await stream.accepted
        except asyncio.CancelledError:
            self.abort(request_id)  # runs after the add on the engine thread: nothing leaks
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks (a no-op if it already finished)."""
        self._commands.put(_Abort(request_id))

    def abort_all(self, error: BaseException) -> None:
        """Abort every unfinished request (their blocks freed); each stream ends with `error`. Thread-safe."""
        self._commands.put(_AbortAll(error))

    # ----- engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        eng = self.engine
        try:
            while True:
                commands = self._take_commands(block=not eng.has_unfinished_requests())
                if any(c is _STOP for c in commands):
                    return
                aborted: list[str] = []
                for c in commands:
                    aborted += self._apply(c)
                # A step with nothing to run still records arrivals and aborts in the trace. Observers
                # go first, and aborted requests count as unfinished until then: once a client sees its
                # request end, /metrics already shows it.
                if commands or eng.has_unfinished_requests():
                    outputs = eng.step()
                    self._observe()
                    self._deliver(outputs)
                self._forget(aborted)
        except BaseException as e:  # a failed step leaves the engine in an unknown state: stop serving
            log.exception("engine step failed; the server stops accepting requests")
            self.error = e
        finally:
            self._fail_all(EngineFailedError("the engine failed while running this request; the server is stopping")
                           if self.error else ServerShuttingDown("the server is shutting down"))
        for callback in self.on_failure if self.error else ():
            try:
                callback(self.error)
            except Exception:
                log.exception("on_failure callback %r failed", callback)

    def _take_commands(self, block: bool) -> list[object]:
        out: list[object] = []
        if block:  # idle: sleep until a command arrives
            out.append(self._commands.get())
        while True:
            try:
                out.append(self._commands.get_nowait())
            except queue.Empty:
                return out

    def _apply(self, c: object) -> list[str]:
        """Carry out one command; returns the ids of the requests it aborted."""
        if isinstance(c, _Add):
            rid = c.stream.request_id
            try:
                self.engine.add_request(rid, c.prompt, c.params, priority=c.priority)
            except Exception as e:  # refused up front: nothing entered the engine
                with self._lock:
                    self._streams.pop(rid, None)
                c.stream.resolve(e)
                return []
            c.stream.resolve(None)
        elif isinstance(c, _Abort):
            self.engine.abort_request(c.request_id)
            return [c.request_id]
        elif isinstance(c, _AbortAll):
            return self._end_all(c.error)
        return []

    def _end_all(self, error: BaseException) -> list[str]:
        """Abort every request the engine holds for a stream; each stream gets `error` as its last item."""
        with self._lock:
            streams = list(self._streams.values())
        self._end_streams(streams, error, abort=True)
        return [s.request_id for s in streams]

    def _end_streams(self, streams: list[RequestStream], error: BaseException, abort: bool) -> None:
        for s in streams:
            if abort:
                self.engine.abort_request(s.request_id)
            try:
                s.resolve(error)  # a no-op if it was already accepted
                s.push(error)
            except RuntimeError:  # its loop is closed
                pass

    def _forget(self, request_ids: list[str]) -> None:
        if request_ids:
            with self._lock:
                for rid in request_ids:
                    self._streams.pop(rid, None)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            with self._lock:
                stream = self._streams.pop(out.request_id) if out.finished else self._streams.get(out.request_id)
            if stream is None:  # aborted: nobody is listening
                continue
            try:
                stream.push(out)
            except RuntimeError:  # its event loop is closed: nobody will read it
                self.engine.abort_request(out.request_id)
                with self._lock:
                    self._streams.pop(out.request_id, None)

    def _observe(self) -> None:
        trace = self.engine.trace
        if self.warming_up:  # no observer sees them and the trace does not keep them
            del trace[self._seen :]
        new = trace[self._seen :]
        for obs in self.observers:
            try:
                obs(new)
            except Exception:  # a broken view must not stop serving
                log.exception("trace observer %r failed", obs)
        w = self.trace_window
        if w is not None and len(trace) > 2 * w:
            del trace[: len(trace) - w]
        self._seen = len(trace)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            streams, self._streams, self._closed = list(self._streams.values()), {}, True
        # a clean stop frees their blocks; after a failed step the engine is not trusted to
        self._end_streams(streams, error, abort=self.error is None)
