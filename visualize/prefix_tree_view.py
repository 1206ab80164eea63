"""View model of the radix prefix cache (prefix_cache="radix") after one step: the tree of cached blocks.

What a reader should see: every cached token run as a node hanging from the
run it continues (the root is the empty prefix), how many tokens and which
physical blocks each holds, which nodes are in use (locked by a running
sequence: never evicted) and which are evictable, and in what order the next
allocations would evict them (unlocked leaves, least recently used first, so
a parent always goes after its children). A pure function of the trace.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from minillm.engine.trace import StepTrace
from minillm.visualize.trace_index import clamp_step


@dataclass(frozen=True)
class TreeNodeView:
    node_id: int
    parent_id: int  # -1 for the root
    start: int  # tokens before this node on its path (x of its left end)
    end: int  # start + its tokens
    y: float  # vertical slot: leaves one apart, a parent at its children's mean
    num_tokens: int
    block_ids: tuple[int, ...]
    lock_ref: int  # running sequences using it (0: evictable)
    last_access: int
    label: str  # the first tokens of its key (text or ids)
    kind: str  # "root" | "locked" | "evictable"
    evict_rank: int | None  # evictable nodes: 0 = evicted first


@dataclass(frozen=True)
class PrefixTreeView:
    step: int
    nodes: tuple[TreeNodeView, ...]
    num_cached_blocks: int
    num_locked_blocks: int
    num_evictable_blocks: int
    prefix_hit_tokens: int  # this step's hits and lookups (the block view shows the same numbers)
    prefix_queried_tokens: int


def prefix_tree_view(trace: Sequence[StepTrace], step: int | None = None,
                     decode: Callable[[tuple[int, ...]], str] | None = None) -> PrefixTreeView:
    """decode: token ids -> text (e.g. tokenizer.decode); ids are shown without one."""
    i = clamp_step(trace, step)
    rec = trace[i]
    recs = {n.node_id: n for n in rec.prefix_tree}
    kids: dict[int, list[int]] = {}
    for n in rec.prefix_tree:
        if n.parent_id >= 0:
            kids.setdefault(n.parent_id, []).append(n.node_id)
    start: dict[int, int] = {}
    ys: dict[int, float] = {}
    leaf = [0]

    def place(nid: int, at: int) -> float:  # depth first: leaves one apart, parents at their children's mean
        start[nid] = at
        below = kids.get(nid, [])
        end = at + recs[nid].num_tokens
        ys[nid] = float(leaf[0]) if not below else sum(place(c, end) for c in below) / len(below)
        if not below:
            leaf[0] += 1
        return ys[nid]

    roots = [n.node_id for n in rec.prefix_tree if n.parent_id < 0]
    for r in roots:
        place(r, 0)
    # the order evict() would take them: unlocked leaves by (last access, id), a parent once its children are gone
    rank: dict[int, int] = {}
    left = {nid: len(kids.get(nid, [])) for nid in recs}
    ready = sorted((recs[n].last_access, n) for n in recs
                   if not left[n] and recs[n].lock_ref == 0 and recs[n].parent_id >= 0)
    while ready:
        _, nid = ready.pop(0)
        rank[nid] = len(rank)
        p = recs[nid].parent_id
        left[p] -= 1
        if not left[p] and recs[p].lock_ref == 0 and recs[p].parent_id >= 0:
            ready.append((recs[p].last_access, p))
            ready.sort()
    text = decode or (lambda ids: " ".join(map(str, ids)))
    nodes = []
    for n in rec.prefix_tree:
        kind = "root" if n.parent_id < 0 else ("locked" if n.lock_ref else "evictable")
        label = "(root)" if kind == "root" else text(n.head_tokens) + (" ..." if n.num_tokens > len(n.head_tokens) else "")
        nodes.append(TreeNodeView(n.node_id, n.parent_id, start[n.node_id], start[n.node_id] + n.num_tokens,
                                  ys[n.node_id], n.num_tokens, n.block_ids, n.lock_ref, n.last_access, label, kind,
                                  rank.get(n.node_id)))
    locked = sum(len(n.block_ids) for n in nodes if n.kind == "locked")
    evictable = sum(len(n.block_ids) for n in nodes if n.kind == "evictable")
    return PrefixTreeView(i, tuple(nodes), locked + evictable, locked, evictable, rec.prefix_hit_tokens,
                          rec.prefix_queried_tokens)
