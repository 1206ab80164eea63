"""`minillm bench prefix`: TTFT with prefix caching on and off, for a long shared system prompt.

Two engines share one model's weights; only `enable_prefix_caching` differs.
Each first serves a warm-up request (which fills the caching engine's cache
with the shared prefix); then the user turns arrive one at a time, the engines
taking turns, so each TTFT is one prefill with no queueing. With a cached prefix
of P tokens and a turn of S tokens the cached engine computes S tokens, not
P + S; the step trace says how many prompt tokens were found in the cache.
"""
from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Callable

from minillm.bench.minillm_subject import MinillmSubject, greedy
from minillm.bench.stats import figure, paired_ratio, percentiles, ratio
from minillm.bench.targets import PREFIX_TTFT_CUT, Target, target
from minillm.bench.workload import random_prompt
from minillm.engine.llm_engine import LLMEngine

Log = Callable[[str], None]


@dataclass(frozen=True)
class PrefixWorkload:
    prefix_len: int = 1024  # the shared system prompt
    num_turns: int = 8  # distinct user turns after it
    turn_len_range: tuple[int, int] = (16, 64)
    output_len: int = 1  # TTFT only needs the first token
    seed: int = 0

    def __post_init__(self) -> None:
        if self.prefix_len < 1 or self.num_turns < 1 or self.output_len < 1:
            raise ValueError("prefix_len, num_turns and output_len must be >= 1")
        if not 1 <= self.turn_len_range[0] <= self.turn_len_range[1]:
            raise ValueError(f"turn_len_range must satisfy 1 <= min <= max, got {self.turn_len_range}")

    def prompts(self, vocab_size: int) -> tuple[list[int], list[list[int]]]:
        """(warm-up prompt, the user turns' prompts): all start with the same prefix."""
        rng = random.Random(f"{self.seed}-prefix")
        prefix = random_prompt(rng, self.prefix_len, vocab_size)
        turns = [prefix + random_prompt(rng, rng.randint(*self.turn_len_range), vocab_size)
                 for _ in range(self.num_turns + 1)]
        return turns[0], turns[1:]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "prompts": "one random-token prefix shared by every prompt + a random turn",
                "arrival": "one request at a time (TTFT = one prefill, no queueing)", "sampling": "greedy"}


def twin_engines(subject: MinillmSubject, kv_cache_memory_bytes: int) -> dict[str, LLMEngine]:
    """Two engines on the subject's model: prefix caching on and off, same KV pool size."""
    old = subject.engine
    out = {}
    for name, caching in (("cached", True), ("uncached", False)):
        # the subject's settings (backend, scheduler) except the pool; neither torch.compile nor drafts
        config = old.config.replace(kv_cache_memory_bytes=kv_cache_memory_bytes, num_kv_blocks=None,
                                    enable_prefix_caching=caching, compile=False, speculative=None)
        out[name] = LLMEngine(old.model, old.tokenizer, sorted(old.eos_token_ids), config)
    return out


def measure_prefix(engines: dict[str, LLMEngine], workload: PrefixWorkload, vocab_size: int,
                   log: Log = lambda s: None) -> dict[str, Any]:
    """TTFT per turn for each engine, interleaved; prefix hits and computed prompt tokens from the trace."""
    warm, turns = workload.prompts(vocab_size)
    subjects = {name: MinillmSubject(e) for name, e in engines.items()}
    for s in subjects.values():  # warm-up: allocations, oneDNN primitives, and the cached engine's cache
        s.run([warm], [greedy(workload.output_len)])
    ttft: dict[str, list[float]] = {name: [] for name in subjects}
    hits: dict[str, int] = {name: 0 for name in subjects}
    computed: dict[str, int] = {name: 0 for name in subjects}
    for i, p in enumerate(turns):
        names = list(subjects) if i % 2 == 0 else list(reversed(subjects))
        for name in names:
            (out,), steps = subjects[name].run([p], [greedy(workload.output_len)])
            ttft[name].append(out.metrics.ttft)
            hits[name] += sum(r.prefix_hit_tokens for r in steps)
            computed[name] += sum(r.num_prefill_tokens for r in steps)
            log(f"turn {i} {name:9s} {len(p)} prompt tokens: TTFT {out.metrics.ttft * 1e3:7.1f} ms")
    return {"ttft": ttft, "prefix_hit_tokens": hits, "computed_prompt_tokens": computed,
            "turn_prompt_tokens": sum(len(p) for p in turns)}


def summarize_prefix(raw: dict[str, Any]) -> dict[str, Any]:
    ttft = raw["ttft"]
    figures = {name: {"ttft_s": figure("s", v), "ttft_percentiles_s": percentiles(v),
                      "prefix_hit_tokens": raw["prefix_hit_tokens"][name],
                      "computed_prompt_tokens": raw["computed_prompt_tokens"][name]}
               for name, v in ttft.items()}
    cut = ratio(statistics.median(ttft["uncached"]), statistics.median(ttft["cached"]))
    ratios = {"ttft_cut": cut, "ttft_cut_paired": paired_ratio(ttft["uncached"], ttft["cached"]),
              "computed_tokens_cut": ratio(raw["computed_prompt_tokens"]["uncached"],
                                           raw["computed_prompt_tokens"]["cached"])}
    targets: list[Target] = [target(PREFIX_TTFT_CUT, cut)]
    return {"figures": figures, "turn_prompt_tokens": raw["turn_prompt_tokens"], "ratios": ratios,
            "targets": targets}
