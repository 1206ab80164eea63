"""Structured outputs in the engine: a grammar matcher per constrained sequence, and the token mask
it puts on every logits row that chooses one of that sequence's tokens.

    compile  off the step, on a thread of its own, cached per spec (GrammarCompiler); the request
             waits outside the scheduler until its grammar is ready, so the batch never stalls
    mask     in the token-choice stage (token_choice.py): row j of a chunk scores the token after
             its drafts[:j], so the matcher walks drafts[:j], writes row j's allowed tokens, and
             walks back (a draft the grammar refuses leaves the rows after it unreachable: the
             verifier rejects it, since its masked probability is 0)
    advance  the tokens the step chose (accepted drafts, then the target's own) move it on

A matcher at the grammar's end allows only the end-of-sequence tokens, so the request ends like
any other stop. The grammar library is xgrammar (compile ~1-16 ms per schema, a mask fill ~5 us
per row on a 49k vocabulary; the results chapter has the comparison); turning its bitmask into
-inf logits is written here, because that is the part worth reading.
"""
from __future__ import annotations

import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from minillm.structured_outputs import StructuredOutputs
    from minillm.engine.batch import ScheduledBatch, StepBatch
    from minillm.engine.scheduler import ChosenTokens

MAX_CACHED_GRAMMARS = 256


@dataclass
class MaskStats:
    """One step's structured-output work, for the trace: rows masked and the seconds spent on it."""

    rows: int = 0
    seconds: float = 0.0


class GrammarCompiler:
    """Compiles specs against one tokenizer's vocabulary on a background thread; equal specs share a
    compiled grammar (the last MAX_CACHED_GRAMMARS kept)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=sorted(eos_token_ids))
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="minillm-grammar")
        self._cache: dict[tuple[str, str], Future] = {}
        self.compile_seconds: list[float] = []  # one per compile run (a cache hit runs none)

    def submit(self, spec: "StructuredOutputs") -> Future:
        """A future of the compiled grammar (done at once when an equal spec was compiled before)."""
        key = spec.key()
        fut = self._cache.pop(key, None)
        if fut is None or (fut.done() and fut.exception() is not None):
            fut = self._thread.submit(self._compile, spec)
        self._cache[key] = fut  # most recently used last
        while len(self._cache) > MAX_CACHED_GRAMMARS:
            del self._cache[next(iter(self._cache))]
        return fut

    def _compile(self, spec: "StructuredOutputs"):
        t0 = time.perf_counter()
        compiled = self._compiler.compile_grammar(spec.to_grammar())
        self.compile_seconds.append(time.perf_counter() - t0)
        return compiled

    def matcher(self, compiled):
        """A fresh matcher at the grammar's start (one per sequence: n > 1 completions walk apart)."""
        return self._xgr.GrammarMatcher(compiled)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def allowed_tokens(bitmask: np.ndarray, vocab_size: int) -> torch.Tensor:
    """[rows, ceil(V / 32)] int32 bitmask -> [rows, V] bool: bit b of word w allows token 32 w + b.

    Read as bytes, little-endian, token t is bit t % 8 of byte t // 8, and numpy's unpackbits turns
    each byte into its 8 bits, lowest first: one C loop, no torch thread pool woken for it."""
    assert sys.byteorder == "little", "the bitmask's words are read as little-endian bytes"
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(bits[:, :vocab_size].view(np.bool_))


def row_prefixes(drafts: list[int], parents: list[int] | None, count: int) -> list[list[int]]:
    """The tokens before the one each logits row scores: a chain's row j follows drafts[:j]; a tree's
    row 0 is the root and row 1 + i follows the path to node i."""
    if parents is None:
        return [drafts[:j] for j in range(count)]
    paths: list[list[int]] = []
    for i, p in enumerate(parents):
        paths.append((paths[p] if p >= 0 else []) + [drafts[i]])
    return [[]] + paths


def mask_logits(batch: "ScheduledBatch", step: "StepBatch", logits: torch.Tensor) -> tuple[torch.Tensor, MaskStats]:
    """Logits with every token each constrained row's grammar forbids at -inf (a copy when any row is
    constrained; the same tensor otherwise)."""
    stats = MaskStats()
    work = [(c, first, count) for c, (first, count) in zip(batch.chunks, step.chunk_logits)
            if count and c.seq.grammar is not None]
    if not work:
        return logits, stats
    t0 = time.perf_counter()
    rows: list[int] = []
    words = (logits.shape[-1] + 31) // 32
    bitmask = np.full((sum(count for _, _, count in work), words), -1, dtype=np.int32)  # -1: every token
    for c, first, count in work:
        matcher = c.seq.grammar
        for j, prefix in enumerate(row_prefixes(list(c.draft_token_ids), c.draft_parents, count)):
            walked = 0
            for tok in prefix:  # a prefix the grammar refuses, or ends, is never reached: leave the row open
                if matcher.is_terminated() or not matcher.accept_token(tok):
                    break
                walked += 1
            if walked == len(prefix) and not matcher.is_terminated():
                matcher.fill_next_token_bitmask(bitmask, len(rows))
            if walked:
                matcher.rollback(walked)
            rows.append(first + j)
    forbidden = (~allowed_tokens(bitmask, logits.shape[-1])).to(logits.device)
    logits = logits.clone()
    for j, row in enumerate(rows):  # in place, row by row: no gather and scatter of the rows
        logits[row].masked_fill_(forbidden[j], float("-inf"))
    stats.rows, stats.seconds = len(rows), time.perf_counter() - t0
    return logits, stats


def advance(batch: "ScheduledBatch", chosen: list["ChosenTokens | None"]) -> None:
    """Move each constrained sequence's matcher over the tokens this step chose for it."""
    for c, picked in zip(batch.chunks, chosen):
        if picked is None or c.seq.grammar is None:
            continue
        for tok in picked.token_ids:
            if c.seq.grammar.is_terminated():  # its end-of-sequence token: the sequence ends here
                break
            if not c.seq.grammar.accept_token(tok):
                raise RuntimeError(f"sequence {c.seq.seq_id}: token {tok} is outside its grammar after masking")


class GrammarGate:
    """Requests whose grammar is compiling wait here, outside the scheduler: the batch goes on
    without them, and they enter the waiting queue, each sequence with its own matcher, once their
    grammar is ready. The engine makes one with its first constrained request."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int]) -> None:
        if tokenizer is None:
            raise ValueError("structured outputs need the engine's tokenizer (this engine has none)")
        self.compiler = GrammarCompiler(tokenizer, vocab_size, eos_token_ids)
        self._held: list[tuple[Future, list]] = []  # (compiled grammar, the request's sequences)

    def __bool__(self) -> bool:
        return bool(self._held)

    def hold(self, seqs: list, spec: "StructuredOutputs") -> None:
        self._held.append((self.compiler.submit(spec), seqs))

    def ready(self, wait: bool = False) -> tuple[list, list[tuple[list, BaseException]]]:
        """(sequences whose grammar is ready, their matchers set; (sequences, error) whose compile failed).
        wait: block until at least one held request is ready (the engine has nothing else to run)."""
        if wait and self._held and not any(f.done() for f, _ in self._held):
            futures_wait([f for f, _ in self._held], return_when=FIRST_COMPLETED)
        ready, failed, still = [], [], []
        for fut, seqs in self._held:
            if not fut.done():
                still.append((fut, seqs))
            elif fut.exception() is not None:
                failed.append((seqs, fut.exception()))
            else:
                for s in seqs:
                    s.grammar = self.compiler.matcher(fut.result())
                ready += seqs
        self._held = still
        return ready, failed

    def drop(self, seqs: list) -> None:
        """An aborted request leaves the gate (its compile, if running, still fills the cache)."""
        self._held = [(f, s) for f, s in self._held if s is not seqs]

    def close(self) -> None:
        self.compiler.close()
