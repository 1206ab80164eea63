"""The step trace: one immutable record per engine step.

Everything that observes the engine -- metrics, benchmarks, the roofline, the
widgets, the HTML report -- reads these records and never the engine's
internals, so each view can be tested on a recorded or synthetic trace.

Times are `time.perf_counter()` seconds (one clock for arrivals, steps and
tokens). Block ids index the physical pool `0 .. num_blocks - 1`.
Events that happen between steps (arrivals, aborts) are reported in the next
step's record.
"""
from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Iterable, Literal

Phase = Literal["prefill", "decode", "verify"]


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence's share of a step."""

    seq_id: int
    request_id: str
    phase: Phase  # prefill chunk, single decode token, or speculative verification
    num_new_tokens: int  # tokens whose K/V this step computed
    num_computed_before: int  # tokens already in the cache before the step (incl. prefix hits)
    context_len: int  # keys attended by the last new token (= before + new)
    num_prefix_hit_tokens: int  # taken from the prefix cache when admitted this step
    num_prompt_tokens: int
    sampled: bool  # did this step produce an output token for it
    priority: int = 0  # the request's (lower first under scheduling_policy="priority")
    lane: str = ""  # "short" | "long" under scheduling_policy="length-aware", "" otherwise


@dataclass(frozen=True)
class Arrival:
    request_id: str
    seq_ids: tuple[int, ...]
    arrival_time: float
    num_prompt_tokens: int
    priority: int = 0
    lane: str = ""
    prompt_token_ids: tuple[int, ...] = ()  # as the model reads them: BOS first where the tokenizer adds it


@dataclass(frozen=True)
class NewTokens:
    seq_id: int
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Finished:
    seq_id: int
    request_id: str
    reason: str  # "stop" | "length" | "abort"
    num_output_tokens: int


@dataclass(frozen=True)
class Preemption:
    seq_id: int
    request_id: str
    reason: str
    num_blocks_freed: int
    num_tokens_lost: int  # computed tokens that will be recomputed


@dataclass(frozen=True)
class QueueEntry:
    """A sequence in the scheduler's queues after a step, as its policy sees it (engine/policy.py)."""

    seq_id: int
    request_id: str
    priority: int
    lane: str  # "short" | "long" under length-aware, "" otherwise
    running: bool  # holds KV blocks; False: waiting (preempted ones included), in admission order


@dataclass(frozen=True)
class SpecRecord:
    """One sequence's speculation in a step (it held lookahead slots; it may have proposed nothing)."""

    seq_id: int
    num_proposed: int
    num_accepted: int  # leading draft tokens the target agreed with
    draft_token_ids: tuple[int, ...] = ()
    num_emitted: int = 0  # accepted + the target's own token, cut short by a stop condition
    bonus: bool = False  # every draft accepted (a tree: a leaf reached): the extra token came for free
    draft_parents: tuple[int, ...] = ()  # a tree of drafts: each one's parent (-1: the newest token); () a chain
    accepted_nodes: tuple[int, ...] = ()  # a tree: the accepted root-to-node path


@dataclass(frozen=True)
class PrefixTreeNode:
    """One node of the radix prefix cache after a step (prefix_cache="radix"; engine/radix_tree.py)."""

    node_id: int
    parent_id: int  # -1 for the root
    num_tokens: int  # the node's key: whole blocks' tokens
    block_ids: tuple[int, ...]  # the physical blocks holding them
    lock_ref: int  # sequences using this node or a node below it (0: evictable)
    last_access: int  # the tree's logical clock at the last hit or insert (LRU order)
    head_tokens: tuple[int, ...] = ()  # the key's first few token ids (a label)


@dataclass(frozen=True)
class DraftRecord:
    """A separate draft model's own KV pool and work in one step (spec_decode/draft_model.py)."""

    num_blocks: int
    num_used_blocks: int
    block_tables: tuple[tuple[int, tuple[int, ...]], ...]  # (seq_id, the draft pool's blocks) after the step
    cached_tokens: tuple[tuple[int, int], ...]  # (seq_id, tokens whose draft K/V are valid)
    blocks_allocated: tuple[int, ...]
    blocks_freed: tuple[int, ...]  # rolled back (rejected guesses), finished or evicted
    num_forwards: int  # draft forward passes this step (a catch-up, then k - 1 decodes)
    num_tokens: int  # rows the draft computed
    num_catch_up_tokens: int  # of which tokens it had not cached (prompts, the target's own tokens)
    duration_s: float  # wall time of the proposal, inside the step's duration
    flops: float  # analytic, like the step's own (engine/cost.py), for the draft's model
    bytes_moved: float
    evicted_seqs: tuple[int, ...] = ()  # states dropped to make room (they catch up again later)
    starved_seqs: tuple[int, ...] = ()  # wanted a proposal but the draft pool had no block
    lookup_seqs: tuple[int, ...] = ()  # proposed by prompt lookup instead (spec_decode/lookup_first.py): no draft work

    @property
    def kv_usage(self) -> float:
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DraftRecord":
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k != "kv_usage"}
        kw["block_tables"] = tuple((sid, tuple(bl)) for sid, bl in d["block_tables"])
        kw["cached_tokens"] = tuple((sid, n) for sid, n in d["cached_tokens"])
        return cls(**kw)


@dataclass(frozen=True)
class StepTrace:
    step: int
    start_time: float
    duration_s: float
    # batch composition
    scheduled: tuple[ScheduledSeq, ...]
    num_prefill_tokens: int
    num_decode_tokens: int
    num_spec_tokens: int
    token_budget: int  # max_num_batched_tokens
    max_num_seqs: int
    num_waiting: int  # queue length after scheduling
    num_running: int  # sequences holding KV blocks after the step
    # request lifecycle
    arrivals: tuple[Arrival, ...]
    new_tokens: tuple[NewTokens, ...]
    finished: tuple[Finished, ...]
    preemptions: tuple[Preemption, ...]
    # the paged pool
    num_blocks: int
    block_size: int
    blocks_allocated: tuple[int, ...]
    blocks_freed: tuple[int, ...]  # ref count reached 0 (content kept if cached)
    blocks_evicted: tuple[int, ...]  # cached content dropped so the block could be reused
    blocks_shared: tuple[int, ...]  # an existing block gained a reference (prefix hit / n > 1)
    block_tables: tuple[tuple[int, tuple[int, ...]], ...]  # (seq_id, physical blocks) after the step
    block_ref_counts: tuple[int, ...]  # per physical block, after the step
    block_cached: tuple[bool, ...]  # per physical block: holds a reusable prefix hash
    free_queue: tuple[int, ...]  # ref-count-0 blocks, next handed out first
    prefix_queried_tokens: int  # prompt tokens looked up in the prefix cache this step
    prefix_hit_tokens: int  # of which found
    # speculative decoding
    spec: tuple[SpecRecord, ...]
    # roofline (analytic, from the model config and the batch)
    flops: float
    bytes_moved: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    # tensor parallelism (minillm/parallel): this step's collective payloads per rank and
    # the wall time rank 0 spent in them; 0 with one rank. Defaults keep old traces loadable.
    allreduce_bytes: float = 0.0
    allgather_bytes: float = 0.0
    comm_time_s: float = 0.0
    p2p_bytes: float = 0.0  # pipeline parallelism: hidden states / logits rank 0 sent and received
    # a separate draft model (speculative method "draft" with its own model): its pool and work
    draft: DraftRecord | None = None
    # prefix_cache="radix": the tree's nodes, root first, parents before children; () otherwise
    prefix_tree: tuple[PrefixTreeNode, ...] = ()
    # a mixture-of-experts model (models/moe.py): expert_tokens[l][e] is how many of this step's tokens
    # layer moe_layers[l] sent to expert e (each token counts once per expert of its top-k); () if dense
    moe_layers: tuple[int, ...] = ()
    expert_tokens: tuple[tuple[int, ...], ...] = ()
    # the queues after the step (the lanes view): waiting sequences in queue order (within a lane, the
    # order it admits them), then the running ones; scheduling_policy names the policy that keeps them
    queue: tuple[QueueEntry, ...] = ()
    scheduling_policy: str = "fcfs"
    # the code that ran the step (engine/fast_path.py): "plain", "compiled graph", "CUDA graph", or a
    # fast path's whole-step runner such as "one-region CPU step"; "" for a step that ran no model
    path: str = ""
    # structured outputs (engine/grammar.py): logits rows masked by a grammar, and the seconds the
    # masks took (walking the matchers, filling and applying the bitmasks)
    grammar_rows: int = 0
    grammar_s: float = 0.0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_spec_tokens

    @property
    def num_used_blocks(self) -> int:
        return sum(1 for r in self.block_ref_counts if r > 0)

    @property
    def kv_usage(self) -> float:
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes_moved if self.bytes_moved else 0.0

    @property
    def achieved_flops_per_s(self) -> float:
        return self.flops / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def achieved_bytes_per_s(self) -> float:
        return self.bytes_moved / self.duration_s if self.duration_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        # the derived roofline figures ride along so a JSONL trace is readable on its own;
        # from_dict reads fields only, so they are recomputed, never trusted, on load
        return {**asdict(self), "arithmetic_intensity": self.arithmetic_intensity,
                "achieved_flops_per_s": self.achieved_flops_per_s, "achieved_bytes_per_s": self.achieved_bytes_per_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepTrace":
        nested = {
            "scheduled": ScheduledSeq, "arrivals": Arrival, "new_tokens": NewTokens,
            "finished": Finished, "preemptions": Preemption, "spec": SpecRecord, "prefix_tree": PrefixTreeNode,
            "queue": QueueEntry,
        }
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d and f.default is not MISSING:  # a field newer than the trace
                continue
            v = d[f.name]
            if f.name in nested:
                kw[f.name] = tuple(nested[f.name](**{k: tuple(x) if isinstance(x, list) else x for k, x in item.items()}) for item in v)
            elif f.name == "draft":
                kw[f.name] = None if v is None else DraftRecord.from_dict(v)
            elif f.name == "block_tables":
                kw[f.name] = tuple((sid, tuple(bl)) for sid, bl in v)
            elif f.name == "expert_tokens":
                kw[f.name] = tuple(tuple(row) for row in v)
            elif isinstance(v, list):
                kw[f.name] = tuple(v)
            else:
                kw[f.name] = v
        return cls(**kw)


def dump_trace(trace: Iterable[StepTrace], path: str) -> None:
    """Write one JSON object per line (JSONL)."""
    with open(path, "w") as f:
        for rec in trace:
            f.write(json.dumps(rec.to_dict()) + "\n")


def load_trace(path: str) -> list[StepTrace]:
    with open(path) as f:
        return [StepTrace.from_dict(json.loads(line)) for line in f if line.strip()]
