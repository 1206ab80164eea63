"""Turning the engine's cumulative outputs into what a client is sent: text deltas and logprobs.

A completion's text only grows: the engine's detokenizer already holds back
what a stream must not leak (a half-decoded multi-byte character, and as many
characters as the longest stop string could already have started; see
minillm/engine/detokenizer.py), so a delta is simply the text not sent yet.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minillm.engine.outputs import CompletionOutput
from minillm.server.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob


@dataclass
class Delta:
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]]
    finish_reason: str | None
    stop_reason: str | int | None


@dataclass
class Cursor:
    """How much of one completion the client has been sent."""

    chars: int = 0
    tokens: int = 0
    text_offset: int = 0  # completions logprobs: where the next token's text starts
    done: bool = False  # the finishing chunk was sent

    def advance(self, out: CompletionOutput, with_tokens: bool) -> "Delta | None":
        """What a stream sends next for this completion; None when there is nothing worth a chunk."""
        if self.done:
            return None
        text = self.text_delta(out)
        ids, lps = self.new_tokens(out)
        self.done = out.finish_reason is not None
        if not (text or self.done or (with_tokens and ids)):
            return None
        return Delta(text, ids, lps, out.finish_reason, out.stop_reason)

    def text_delta(self, out: CompletionOutput) -> str:
        if len(out.text) <= self.chars:
            return ""
        delta, self.chars = out.text[self.chars:], len(out.text)
        return delta

    def new_tokens(self, out: CompletionOutput) -> tuple[list[int], list[dict[int, float]]]:
        ids = out.token_ids[self.tokens:]
        lps = (out.logprobs or [])[self.tokens:self.tokens + len(ids)]
        self.tokens += len(ids)
        return ids, lps


def token_text(tokenizer: Any | None, token_id: int) -> str:
    # without a tokenizer, name the id the way vLLM's return_tokens_as_token_ids does
    return f"token_id:{token_id}" if tokenizer is None else tokenizer.decode([token_id])


def _top(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
    # the engine's entry holds the sampled token plus the top-k alternatives
    return sorted(entry.items(), key=lambda kv: -kv[1])[:k]


def completion_logprobs(tokenizer: Any | None, ids: list[int], lps: list[dict[int, float]], k: int,
                        cursor: Cursor) -> CompletionLogprobs:
    """The legacy completions format; top_logprobs always includes the sampled token (as vLLM does)."""
    out = CompletionLogprobs()
    for tid, entry in zip(ids, lps):
        text = token_text(tokenizer, tid)
        out.tokens.append(text)
        out.token_logprobs.append(entry.get(tid))
        top = {token_text(tokenizer, t): v for t, v in _top(entry, k)}
        top.setdefault(text, entry.get(tid, float("-inf")))
        out.top_logprobs.append(top)
        out.text_offset.append(cursor.text_offset)
        cursor.text_offset += len(text)
    return out


def chat_logprobs(tokenizer: Any | None, ids: list[int], lps: list[dict[int, float]], k: int) -> ChatLogprobs:
    def item(t: int, v: float) -> TopLogprob:
        s = token_text(tokenizer, t)
        return TopLogprob(token=s, logprob=v, bytes=list(s.encode("utf-8")))

    content = []
    for tid, entry in zip(ids, lps):
        main = item(tid, entry.get(tid, float("-inf")))
        content.append(ChatTokenLogprob(**main.model_dump(), top_logprobs=[item(t, v) for t, v in _top(entry, k)]))
    return ChatLogprobs(content=content)
