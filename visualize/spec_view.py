"""View model of one step's speculation: each sequence's guesses as a tree, and what the target kept.

What a reader should see: the sequence's newest token (the root), every guessed
token hanging from the token it continues (a chain is a tree with one branch;
a Medusa tree branches where a head offered several candidates), the path the
target accepted, and the one token the target chose itself after it (a
correction, or a bonus at the end of a fully accepted branch). A pure function
of the trace, like the other views.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from minillm.engine.trace import StepTrace
from minillm.spec_decode.tree import chain_parents, children, node_depths
from minillm.visualize.trace_index import clamp_step, seq_infos


@dataclass(frozen=True)
class SpecNode:
    index: int  # -1: the root (newest token); 0..N-1: guesses; N: the target's own token
    parent: int | None  # None for the root
    depth: int  # 0 for the root
    y: float  # vertical slot, leaves spread one apart
    label: str  # the token's text (or id), or "(newest)" for the root
    kind: str  # "root" | "accepted" | "rejected" | "target"


@dataclass(frozen=True)
class SeqSpecTree:
    seq_id: int
    label: str
    nodes: tuple[SpecNode, ...]
    num_proposed: int
    num_accepted: int
    is_tree: bool  # branched (a token tree) rather than a chain


@dataclass(frozen=True)
class SpecTreeView:
    step: int
    seqs: tuple[SeqSpecTree, ...]


def spec_tree_view(trace: Sequence[StepTrace], step: int | None = None,
                   decode: Callable[[int], str] | None = None) -> SpecTreeView:
    """decode: token id -> text (e.g. lambda t: tokenizer.decode([t])); ids are shown without one."""
    i = clamp_step(trace, step)
    rec = trace[i]
    infos = seq_infos(trace, i)
    emitted = {n.seq_id: n.token_ids for n in rec.new_tokens}
    text = decode or str
    seqs = []
    for r in rec.spec:
        if not r.num_proposed:
            continue
        parents = list(r.draft_parents) if r.draft_parents else chain_parents(r.num_proposed)
        path = list(r.accepted_nodes) if r.draft_parents else list(range(r.num_accepted))
        n = len(parents)
        tip = path[-1] if path else -1
        out = emitted.get(r.seq_id, ())
        target = out[-1] if len(out) == len(path) + 1 else None  # None: cut short by a stop condition
        drawn = parents + ([tip] if target is not None else [])  # the target's token hangs at the path's end
        kids = children(drawn)
        depth = {-1: 0, **dict(enumerate(node_depths(drawn)))}
        ys: dict[int, float] = {}
        leaf = [0]

        def place(node: int) -> float:  # leaves one apart in depth-first order, parents at their children's mean
            below = kids.get(node, [])
            if not below:
                ys[node] = float(leaf[0])
                leaf[0] += 1
            else:
                ys[node] = sum(place(c) for c in below) / len(below)
            return ys[node]

        place(-1)
        on_path = set(path)
        nodes = [SpecNode(-1, None, 0, ys[-1], "(newest)", "root")]
        for j, p in enumerate(parents):
            nodes.append(SpecNode(j, p, depth[j], ys[j], text(r.draft_token_ids[j]),
                                  "accepted" if j in on_path else "rejected"))
        if target is not None:
            nodes.append(SpecNode(n, tip, depth[n], ys[n], text(target), "target"))
        info = infos.get(r.seq_id)
        seqs.append(SeqSpecTree(r.seq_id, info.label if info else f"seq{r.seq_id}", tuple(nodes), r.num_proposed,
                                r.num_accepted, any(parents[j] != j - 1 for j in range(n))))
    return SpecTreeView(i, tuple(seqs))
