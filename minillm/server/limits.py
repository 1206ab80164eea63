"""How much one request may ask of the server, checked before it costs anything.

Each bound answers a way one client could take the server from the others: a body
too large to parse (413, read no further), an `n` that fills the batch, a prompt
too long to fit checked before it is tokenized, stop strings that every step must
search. Lists the engine walks per token (stop strings, stop token ids) are bounded
in the request schema itself (protocol.py), so the OpenAPI document states them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minillm.server.errors import APIError, bad_request

DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20


@dataclass(frozen=True)
class ServerLimits:
    max_n: int = 128  # completions per prompt (`minillm serve`: --max-num-seqs, the batch's seats)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # the HTTP body; more is a 413

    def __post_init__(self) -> None:
        if self.max_n < 1 or self.max_request_bytes < 1024:
            raise ValueError(f"ServerLimits: max_n must be >= 1 and max_request_bytes >= 1024, got {self}")

    def check_n(self, n: int) -> None:
        if n > self.max_n:
            raise bad_request(f"n must be at most {self.max_n} on this server, got {n}", "n")


def longest_token_bytes(tokenizer: Any | None) -> int | None:
    """The most UTF-8 bytes any one token's text can stand for (an upper bound), or None if unknown.

    A token's stored string is at least as long in UTF-8 as the text it decodes to (byte-level BPE
    writes each byte as one printable character of 1-2 bytes; SentencePiece writes a space as the
    3-byte "▁"), so prompt bytes > tokens x this bound means more tokens than the context holds."""
    vocab = getattr(tokenizer, "get_vocab", None)
    if vocab is None:
        return None
    try:
        return max((len(t.encode("utf-8")) for t in vocab()), default=None)
    except Exception:  # a tokenizer without a usable vocabulary: no shortcut, tokenize as usual
        return None


def check_text_fits(text: str, max_model_len: int, token_bytes: int | None, param: str) -> None:
    """Refuse a text that cannot fit the context whatever its tokenization, without tokenizing it."""
    if token_bytes is None:
        return
    size = len(text.encode("utf-8"))
    if size > max_model_len * token_bytes:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt is {size} bytes "
            f"long, more than {max_model_len} tokens of at most {token_bytes} bytes each can hold. Please reduce the "
            f"length of the prompt.", param, "context_length_exceeded")


class BodySizeLimit:
    """ASGI middleware: a request body over `max_bytes` gets a 413 as soon as its size is known
    (Content-Length), or as soon as the bytes read pass the limit (chunked uploads), and is read no
    further. A body within the limit is read here and handed on whole (FastAPI reads it whole anyway)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send, int(declared))
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send, size)
                return
        body: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            nonlocal body
            if body is not None:
                message, body = body, None
                return message
            return await receive()  # after the body: the disconnect the handlers watch for

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: int) -> None:
        err = APIError(413, f"the request body is at least {size} bytes; this server accepts at most {self.max_bytes}",
                       "invalid_request_error", None, "request_too_large")
        await err.response()(scope, receive, send)
