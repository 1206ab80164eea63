"""`minillm bench prefix --workload chat`: a multi-turn chat, no prefix cache vs the hash chain vs the radix tree.

Each conversation starts with one shared system prompt; turn t's prompt is the
system prompt, every earlier user message and answer, and a new user message
(the answers are the engine's own greedy outputs, so each turn extends the
previous turn's full sequence). Several conversations are interleaved: at most
`concurrency` turns are in flight, and a conversation whose turn finished goes
to the back of the line, so between two turns of one conversation the others
run and compete for the KV pool. The pool is a fraction of what every
conversation's final turn would need: caches must evict.

Measured per cache, each engine running the same workload in turn on one model:
hit rate (prompt tokens found in the cache / prompt tokens), prompt tokens
computed, TTFT P50/P99 over all turns (queueing included: turns arrive when
the previous one of their conversation finishes), blocks evicted, preemptions.
"""
from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Callable

from minillm.bench.minillm_subject import greedy
from minillm.bench.stats import percentiles
from minillm.bench.workload import random_prompt
from minillm.engine.llm_engine import LLMEngine

Log = Callable[[str], None]
CACHES = {"none": dict(enable_prefix_caching=False), "hash": dict(enable_prefix_caching=True, prefix_cache="hash"),
          "radix": dict(enable_prefix_caching=True, prefix_cache="radix")}


@dataclass(frozen=True)
class ChatWorkload:
    system_len: int = 256  # the system prompt every conversation starts with
    num_conversations: int = 12
    num_turns: int = 4
    user_len_range: tuple[int, int] = (16, 64)
    answer_len: int = 32  # tokens generated per turn (greedy, ignore_eos)
    concurrency: int = 4  # turns in flight at once
    pool_fraction: float = 0.5  # the KV pool / the blocks every final turn would need at once
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("system_len", "num_conversations", "num_turns", "answer_len", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.user_len_range[0] <= self.user_len_range[1]:
            raise ValueError(f"user_len_range must satisfy 1 <= min <= max, got {self.user_len_range}")
        if not 0.0 < self.pool_fraction:
            raise ValueError(f"pool_fraction must be > 0, got {self.pool_fraction}")

    def messages(self, vocab_size: int) -> tuple[list[int], list[list[list[int]]]]:
        """(system prompt, user messages per conversation per turn), random token ids, seeded."""
        rng = random.Random(f"{self.seed}-chat")
        system = random_prompt(rng, self.system_len, vocab_size)
        users = [[random_prompt(rng, rng.randint(*self.user_len_range), vocab_size) for _ in range(self.num_turns)]
                 for _ in range(self.num_conversations)]
        return system, users

    def final_lengths(self, vocab_size: int) -> list[int]:
        """Tokens of each conversation's last turn, answer included (the pool is sized from these)."""
        system, users = self.messages(vocab_size)
        return [len(system) + sum(len(u) for u in conv) + self.num_turns * self.answer_len for conv in users]

    def pool_blocks(self, vocab_size: int, block_size: int) -> int:
        """pool_fraction of every final turn at once, but never less than `concurrency` of the longest."""
        lengths = self.final_lengths(vocab_size)
        need = sum(-(-n // block_size) for n in lengths)
        floor = self.concurrency * (-(-max(lengths) // block_size) + 1)
        return max(floor, int(need * self.pool_fraction))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "prompts": "system prompt + earlier turns (user message + the engine's answer) + "
                                           "a new user message; random token ids",
                "arrival": "a conversation's next turn arrives when its previous one finishes, behind the others",
                "sampling": "greedy, ignore_eos"}


def chat_engines(base: LLMEngine, num_blocks: int, caches=tuple(CACHES)) -> dict[str, LLMEngine]:
    """One engine per cache on base's model, the same pool of num_blocks blocks (no compile, no drafts)."""
    out = {}
    for name in caches:
        config = base.config.replace(num_kv_blocks=num_blocks, kv_cache_memory_bytes=None, compile=False,
                                     speculative=None, **CACHES[name])
        out[name] = LLMEngine(base.model, base.tokenizer, sorted(base.eos_token_ids), config)
    return out


def run_chat(engine: LLMEngine, workload: ChatWorkload, vocab_size: int, log: Log = lambda s: None) -> dict[str, Any]:
    """Serve every conversation's turns on one engine; TTFTs, hits and the tokens of every turn."""
    system, users = workload.messages(vocab_size)
    history = [list(system) for _ in users]
    turn = [0] * len(users)
    ready = deque(range(len(users)))
    in_flight: dict[str, tuple[int, list[int]]] = {}
    ttft, prompt_tokens, outputs = [], 0, {}
    first = len(engine.trace)
    t0 = time.perf_counter()
    while ready or in_flight:
        while ready and len(in_flight) < workload.concurrency:
            c = ready.popleft()
            prompt = history[c] + users[c][turn[c]]
            rid = f"chat-{c}-{turn[c]}"
            engine.add_request(rid, prompt, greedy(workload.answer_len))
            in_flight[rid] = (c, prompt)
            prompt_tokens += len(prompt)
        for out in engine.step():
            if not out.finished:
                continue
            c, prompt = in_flight.pop(out.request_id)
            answer = list(out.outputs[0].token_ids)
            outputs[out.request_id] = answer
            ttft.append(out.metrics.ttft)
            history[c] = prompt + answer
            turn[c] += 1
            if turn[c] < workload.num_turns:
                ready.append(c)
    wall = time.perf_counter() - t0
    steps = engine.trace[first:]
    hits = sum(r.prefix_hit_tokens for r in steps)
    cache = engine.config.prefix_cache if engine.config.enable_prefix_caching else "none"
    log(f"{cache}: {len(ttft)} turns in {wall:.1f} s, hit rate {hits / prompt_tokens:.3f}")
    return {"ttft_s": ttft, "prompt_tokens": prompt_tokens, "prefix_hit_tokens": hits,
            "computed_prompt_tokens": sum(r.num_prefill_tokens for r in steps),
            "blocks_evicted": sum(len(r.blocks_evicted) for r in steps),
            "preemptions": sum(len(r.preemptions) for r in steps), "num_steps": len(steps), "wall_s": wall,
            "outputs": outputs}


def measure_chat(engines: dict[str, LLMEngine], workload: ChatWorkload, vocab_size: int,
                 log: Log = lambda s: None) -> dict[str, Any]:
    """Each engine serves the whole workload, in turn; their answers must agree (greedy, exact caches)."""
    warm = ChatWorkload(system_len=8, num_conversations=1, num_turns=1, user_len_range=(4, 4), answer_len=2)
    for e in engines.values():  # allocations and oneDNN primitives before anything is timed
        run_chat(e, warm, vocab_size)
    raw = {name: run_chat(e, workload, vocab_size, log) for name, e in engines.items()}
    outs = [r.pop("outputs") for r in raw.values()]
    raw_agree = all(o == outs[0] for o in outs)
    return {"per_cache": raw, "outputs_identical": raw_agree}


def summarize_chat(raw: dict[str, Any]) -> dict[str, Any]:
    figures = {}
    for name, r in raw["per_cache"].items():
        figures[name] = {
            "hit_rate": r["prefix_hit_tokens"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0,
            "ttft_percentiles_s": percentiles(r["ttft_s"]),
            **{k: r[k] for k in ("prompt_tokens", "prefix_hit_tokens", "computed_prompt_tokens", "blocks_evicted",
                                 "preemptions", "num_steps", "wall_s")},
        }
    return {"figures": figures, "outputs_identical": raw["outputs_identical"]}


def format_chat(summary: dict[str, Any]) -> str:
    lines = ["prefix caching on a multi-turn chat: hit rate = prompt tokens found in the cache / prompt tokens"]
    for name, f in summary["figures"].items():
        p = f["ttft_percentiles_s"]
        lines.append(f"  {name:6s} hit rate {f['hit_rate']:.3f}  TTFT P50 {p['p50'] * 1e3:7.1f} ms  P99 "
                     f"{p['p99'] * 1e3:7.1f} ms  computed {f['computed_prompt_tokens']} of {f['prompt_tokens']} "
                     f"prompt tokens, {f['blocks_evicted']} blocks evicted, {f['preemptions']} preemptions")
    lines.append(f"  greedy outputs identical across caches: {summary['outputs_identical']}")
    return "\n".join(lines)
