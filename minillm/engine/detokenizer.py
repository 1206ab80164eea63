"""Incremental detokenization: token ids -> text, one token at a time, plus stop strings.

The naive way to keep a request's text up to date is to decode the whole output
again after every token. That is O(n) per token, O(n^2) per request, and it is
what a serving engine does for every running sequence on every step.

Why not decode each new token alone and append? Because text is not a
concatenation of per-token pieces:

  * byte-level BPE (GPT-2, Llama 3, SmolLM2) tokens are bytes; an emoji is 4
    bytes and may be split over 2-4 tokens. Decoded alone, a partial character
    comes out as U+FFFD, the replacement character.
  * sentencepiece-style decoders (Llama 2, Mistral) strip the leading space of
    the *first* token of whatever they decode, so "▁world" alone is "world",
    while after "▁Hello" it is " world".

The prefix/read window (the technique vLLM and TGI use). Keep two offsets into
the output ids, prefix <= read. ids[:read] is already turned into text;
ids[prefix:read] is a little context in front of the new tokens. For each new
token decode two short windows,

    prefix_text = decode(ids[prefix:read])      (cached from the step that set it)
    window      = decode(ids[prefix:])

and the new text is window[len(prefix_text):]. Both windows start at the same
token, so whatever the decoder does at the start of a string (stripping a space)
happens to both and cancels. If the new text ends in U+FFFD a character is only
half there: keep the offsets and try again with the next token (the text so far
then ends in that U+FFFD, which the next tokens will replace). Otherwise accept
it: prefix moves to the old read and read to the end.

One safety net over the textbook version: if a window does not start with
prefix_text, the decoder was not local: a later token changed earlier text. The
byte-fallback decoder (sentencepiece models) does that, it decodes a run of byte
tokens as a whole, so '#' as a byte token followed by the first byte of 'é' is two
U+FFFD until the 'é' is complete; so can the space cleanup of some WordPiece
tokenizers. Then we decode the whole output once for that step. It is rare and
keeps `text` exact, but text a stream already showed may change in such a step
(it comes back if the bytes end up valid UTF-8); no incremental scheme avoids that.

So `text` is tokenizer.decode(output_ids, skip_special_tokens=...) after every
token. For byte-level BPE that holds by construction: the output's bytes are the
windows' bytes end to end, and every window starts on a character boundary (an
accepted text never ends in half a character). For sentencepiece-style decoders
both windows lose the same leading space, and the safety net takes care of byte
runs. tests/test_detokenizer.py
checks it token by token against the full decode, for the default model's
tokenizer and for a sentencepiece-style one. The cost: two decodes of a few
tokens per token (the second only when text was accepted) instead of one of all.

Why not tokenizers' DecodeStream? It is the same window in Rust and faster, but it
hides the ids it holds back: a text ending in half a character never comes out,
while tokenizer.decode ends it with U+FFFD, and we want exactly that text. We do
call the Rust backend directly when transformers' decode would add nothing to it.

The prompt is not used as decode context. vLLM starts the window inside the
prompt so that the first output token keeps its leading space under sentencepiece;
minillm's output text is the output ids decoded on their own, which strips it.

Stop strings. Searching the whole text every step is O(n) again. A stop string
that completes with this token must end in the new text, so it starts at most
len(stop) - 1 characters before it: search from there. The first match in the
text wins (ties: the one listed first), the text is cut just before it.

min_tokens. The output must keep at least the text of its first min_tokens
tokens: no stop string is looked for before then, and a match may not cut into
that text (a stop string that starts inside it is ignored, even one that only
completes with a later token). So with min_tokens = m the earliest token a stop
string can end the output at is token m + 1, as for EOS: the sampler bans EOS and
stop_token_ids while fewer than m tokens are out (sampler.min_tokens_bans).

Streaming without leaking a stop string. A stream must never show text that a
stop string will later cut away. The text can still be cut anywhere in its last
(longest stop - 1) characters (a stop string may be starting there), and a
trailing U+FFFD is half a character, so visible_text holds both back. Everything
before that is final: every visible text is a prefix of the finished text.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from minillm.sampling_params import SamplingParams

REPLACEMENT = "\ufffd"  # what a decoder prints for a partial (or invalid) UTF-8 character


def _stable_len(text: str) -> int:
    """Length of text without its trailing U+FFFD (those may still become a real character)."""
    end = len(text)
    while end and text[end - 1] == REPLACEMENT:  # no rstrip: that would copy the text
        end -= 1
    return end


def _window_decoder(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """decode(ids) for short windows, equal to tokenizer.decode(ids, skip_special_tokens=...).

    transformers' fast-tokenizer decode is the Rust backend's decode plus optional
    space cleanup plus Python overhead (~2 us per call); when it would do no cleanup
    and is not overridden, call the backend directly.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        from transformers import PreTrainedTokenizerFast

        cls = type(tokenizer)
        if cls.decode is PreTrainedTokenizerFast.decode and cls._decode is PreTrainedTokenizerFast._decode:
            return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@dataclass(eq=False)
class IncrementalDetokenizer:
    """One sequence's output text, kept up to date token by token (see the module docstring)."""

    tokenizer: Any = field(repr=False)  # None: no text (engines fed token ids only); stop strings ignored
    prompt_token_ids: list[int] = field(repr=False)  # kept for callers; not decode context (see above)
    params: SamplingParams = field(repr=False)

    text: str = field(default="", init=False)  # decoded output so far; after a stop, cut before it
    token_ids: list[int] = field(default_factory=list, init=False)  # output ids seen so far
    stop_string: str | None = field(default=None, init=False)  # the stop string that ended the text

    # the window: ids[:_read] are text (_read_text), _prefix_text = decode(ids[_prefix:_read])
    _prefix: int = field(default=0, init=False, repr=False)
    _read: int = field(default=0, init=False, repr=False)
    _prefix_text: str = field(default="", init=False, repr=False)
    _read_text: str = field(default="", init=False, repr=False)
    # stop strings: text before _checked was searched; no cut below _floor (min_tokens' text)
    _checked: int = field(default=0, init=False, repr=False)
    _floor: int = field(default=0, init=False, repr=False)
    _stops: list[str] = field(default_factory=list, init=False, repr=False)
    _hold: int = field(default=0, init=False, repr=False)  # longest stop string - 1
    _decode: Callable[[list[int]], str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.tokenizer is not None:
            self._decode = _window_decoder(self.tokenizer, self.params.skip_special_tokens)
            self._stops = list(self.params.stop or [])
            self._hold = max((len(s) for s in self._stops), default=1) - 1

    def append(self, token_id: int) -> str | None:
        """Add one output token; decode only a short window (no full re-decode).

        Returns the stop string that completed with this token (and cuts self.text just
        before it), else None. A stop string only counts when the output has reached
        params.min_tokens tokens (this token included), and a match may never cut the text
        below the text of the first min_tokens tokens: a stop string that occurred before
        min_tokens is ignored. Only the newly decoded text plus len(stop)-1 characters
        before it is searched, so a stop string spanning two tokens is found.
        After a stop string the text is final: further tokens are ignored (returns None).
        """
        if self.stop_string is not None:
            return None
        self.token_ids.append(token_id)
        if self._decode is None:
            return None
        self._advance()
        n = len(self.token_ids)
        min_tokens = self.params.min_tokens
        if n == min_tokens:
            self._floor = _stable_len(self.text)
        found = None
        if self._stops and n >= min_tokens:
            found = self._find_stop()
        if found is None:
            self._checked = _stable_len(self.text)
            return None
        at, stop = found
        self.text, self.stop_string = self.text[:at], stop
        return stop

    def visible_text(self, finished: bool) -> str:
        """What a stream may show now: while not finished, hold back the last (longest stop
        string - 1) characters and any trailing U+FFFD (a multi-byte character decoded
        halfway); finished: self.text. Every visible_text(False) is a prefix of the final text.
        """
        if finished or self.stop_string is not None:
            return self.text
        end = max(0, _stable_len(self.text) - self._hold)
        return self.text[:end]

    # ----- internals ---------------------------------------------------------------
    def _advance(self) -> None:
        """Decode the window with the new token and update text and the offsets."""
        ids, decode = self.token_ids, self._decode
        window = decode(ids[self._prefix :])
        if not window.startswith(self._prefix_text):  # not local: earlier text changed
            full = decode(ids)
            common = len(os.path.commonprefix([self.text, full]))
            self._checked = min(self._checked, common)
            self.text = self._read_text = full
            self._read, self._prefix_text = len(ids), window
            return
        new = window[len(self._prefix_text) :]
        self.text = self._read_text + new
        if not new or new.endswith(REPLACEMENT):
            return  # nothing yet, or half a character: wait for the next token
        self._prefix, self._prefix_text = self._read, decode(ids[self._read :])
        self._read, self._read_text = len(ids), self.text

    def _find_stop(self) -> tuple[int, str] | None:
        """(position, stop string) of the first stop string in the new text, or None."""
        best: tuple[int, str] | None = None
        for stop in self._stops:
            start = max(self._floor, self._checked - (len(stop) - 1))
            at = self.text.find(stop, start)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        return best
