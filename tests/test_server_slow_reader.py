"""A client that reads its stream very slowly must not slow anyone else down.

One streaming client asks for a large completion (300 tokens with 20 logprobs each:
~180 KB of server-sent events) and then reads it 512 bytes at a time with a pause
after each read (~10 KB/s), through a socket with a small receive buffer. The server's listening
socket gets a small send buffer too (accepted sockets inherit it), so the kernel
cannot swallow the whole stream: the server's writes to the slow client really
block (asserted below, by counting the bytes the app hands to the server) -- as
they would for a slow client on a real network once the buffers on the way fill.

While it dawdles (its engine request already finished: only its HTTP response is
pending), rounds of N_CLIENTS concurrent normal streaming requests must complete in
about the time the same rounds took just before, without the slow reader (a
generous bound: each < 2x the slowest baseline round + slack, on a shared 2-core
machine). Then the slow reader reads the rest at full speed (so the test does not
wait ~20 s for it) and must get its whole stream, whose text and tokens equal a
non-streamed request with the same greedy parameters, and the KV pool must be whole.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx

from minillm.server import create_app
from minillm.server.background import ServerThread
from tests.test_server_helpers import MODEL_NAME, tiny_engine

N_CLIENTS = 4
ROUNDS = 3
NORMAL_TOKENS = 96
PROMPTS = ["The cat sat", "Hello world! What is", "One, two, three,", "def add(a, b):"]
SLOW_BODY = {"model": MODEL_NAME, "prompt": "the sun, the moon and", "max_tokens": 300, "temperature": 0,
             "ignore_eos": True, "logprobs": 20}
SLOW_READ_BYTES = 512  # per read ...
SLOW_PAUSE_S = 0.05  # ... and then a pause: ~10 KB/s, the stream would take ~20 s (it hurries once measured)
SMALL_BUFFER = 4096  # SO_SNDBUF of the server's sockets, SO_RCVBUF of the slow client's (Linux doubles both)
RATIO, SLACK_S = 2.0, 0.5


class ResponseBytes:
    """ASGI wrapper: how many body bytes the app has handed to the server for requests marked `x-slow-reader`,
    and whether their last one was sent. (`state` is passed through: ServerThread waits for the warm-up on it.)"""

    def __init__(self, app) -> None:
        self.app, self.state = app, app.state
        self.sent, self.complete = 0, False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or (b"x-slow-reader", b"1") not in scope["headers"]:
            return await self.app(scope, receive, send)

        async def counted(message) -> None:
            await send(message)  # returns once the server took it: it blocks while the client does not read
            if message["type"] == "http.response.body":
                self.sent += len(message.get("body", b""))
                self.complete = self.complete or not message.get("more_body", False)

        return await self.app(scope, receive, counted)


class SlowReader(threading.Thread):
    """POST a streaming completion over a raw socket, then read the answer a little at a time, slowly."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(name="slow-reader", daemon=True)
        self.host, self.port = host, port
        self.raw = bytearray()
        self.first_read = threading.Event()
        self.hurry = threading.Event()  # set once the others were timed: read the rest at full speed
        self.eof = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)  # before connect: sets the window
                s.settimeout(60)
                s.connect((self.host, self.port))
                body = json.dumps({**SLOW_BODY, "stream": True}).encode()
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\nX-Slow-Reader: 1\r\nConnection: close\r\n\r\n%s"
                          % (self.host.encode(), len(body), body))
                while True:
                    data = s.recv(1 << 16 if self.hurry.is_set() else SLOW_READ_BYTES)
                    if not data:
                        break
                    self.raw += data
                    self.first_read.set()
                    if not self.hurry.is_set():
                        time.sleep(SLOW_PAUSE_S)
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.first_read.set()
            self.eof.set()

    def events(self) -> list[str]:
        """The SSE `data:` payloads of the (chunked) HTTP/1.1 response."""
        head, _, rest = bytes(self.raw).partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        assert b" 200 " in status + b" ", head
        assert b"transfer-encoding: chunked" in head.lower(), head
        body = bytearray()
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            body += rest[:size]
            assert rest[size:size + 2] == b"\r\n", "malformed chunk"
            rest = rest[size + 2:]
        events = [e for e in body.decode().split("\n\n") if e]
        assert all(e.startswith("data: ") for e in events), events[:3]
        return [e[len("data: "):] for e in events]


async def normal_stream(http: httpx.AsyncClient, i: int) -> str:
    body = {"model": MODEL_NAME, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": NORMAL_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    text, finish, usage, done = "", None, None, False
    async with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line:
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            obj = json.loads(data)
            assert "error" not in obj, obj
            for ch in obj["choices"]:
                text += ch["text"]
                finish = ch["finish_reason"] or finish
            usage = obj.get("usage") or usage
    assert done and finish == "length" and usage["completion_tokens"] == NORMAL_TOKENS, (done, finish, usage)
    return text


async def rounds(url: str, count: int) -> tuple[list[float], list[list[str]]]:
    """`count` rounds of N_CLIENTS concurrent streams; each round's wall time and texts."""
    times, texts = [], []
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for _ in range(count):
            t0 = time.perf_counter()
            texts.append(list(await asyncio.gather(*(normal_stream(http, i) for i in range(N_CLIENTS)))))
            times.append(time.perf_counter() - t0)
    return times, texts


def wait_for(cond, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_slow_reader_does_not_slow_the_others():
    engine = tiny_engine()
    app = create_app(engine, model_name=MODEL_NAME)
    ae = app.state.server.engine
    wrapped = ResponseBytes(app)
    srv = ServerThread(wrapped)
    srv.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)  # inherited by accepted sockets
    with srv:
        ref = httpx.post(srv.url + "/v1/completions", json=SLOW_BODY, timeout=60)
        assert ref.status_code == 200, ref.text
        ref_choice = ref.json()["choices"][0]
        asyncio.run(rounds(srv.url, 1))  # warm-up
        base_times, base_texts = asyncio.run(rounds(srv.url, ROUNDS))

        reader = SlowReader(srv.host, srv.port)
        reader.start()
        assert reader.first_read.wait(30) and reader.error is None, reader.error
        # its engine request finishes at once (the engine never waits for a reader); what is left is an HTTP
        # response the client is slow to take
        assert wait_for(lambda: ae.num_unfinished == 0 and not engine.has_unfinished_requests()), \
            "the engine did not finish the slow reader's request: it waits for its reader?"
        slow_times, slow_texts = asyncio.run(rounds(srv.url, ROUNDS))
        # the slow reader was dawdling all along, and the server really was held up writing to it
        still_reading, sent_meanwhile, complete_meanwhile = not reader.eof.is_set(), wrapped.sent, wrapped.complete

        reader.hurry.set()
        reader.join(60)
        assert not reader.is_alive() and reader.error is None, reader.error
        assert wait_for(lambda: ae.num_unfinished == 0 and not engine.has_unfinished_requests()), "requests left"
        health = httpx.get(srv.url + "/health", timeout=10)

    base, slow = max(base_times), max(slow_times)  # every round beside the slow reader, against the slowest without
    summary = (f"{N_CLIENTS} concurrent streams of {NORMAL_TOKENS} tokens per round: without the slow reader "
               f"{[round(t, 3) for t in base_times]}s, beside it {[round(t, 3) for t in slow_times]}s "
               f"(bound {RATIO:g} x {base:.3f}s + {SLACK_S:g}s); slow stream {len(reader.raw)} bytes, "
               f"{sent_meanwhile} of them handed to the server while the others ran")
    print("\n" + summary)
    assert slow < RATIO * base + SLACK_S, f"the slow reader slowed the others down: {summary}"
    assert still_reading, f"the slow reader finished before the others did: nothing was measured\n{summary}"
    assert not complete_meanwhile and sent_meanwhile < len(reader.raw), \
        f"the server's writes to the slow reader never blocked: nothing was measured\n{summary}"
    assert slow_texts == base_texts, "the same greedy requests gave other texts beside the slow reader"

    # the slow reader got its whole stream: the same text and tokens as the non-streamed request
    events = reader.events()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("error" not in c for c in chunks), [c for c in chunks if "error" in c][:1]
    choices = [ch for c in chunks for ch in c["choices"]]
    text = "".join(ch["text"] for ch in choices)
    tokens = [t for ch in choices if ch["logprobs"] for t in ch["logprobs"]["tokens"]]
    assert text == ref_choice["text"] and tokens == ref_choice["logprobs"]["tokens"]
    assert len(tokens) == SLOW_BODY["max_tokens"]
    assert [ch["finish_reason"] for ch in choices if ch["finish_reason"]] == ["length"]

    assert health.status_code == 200
    assert not engine.requests
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
