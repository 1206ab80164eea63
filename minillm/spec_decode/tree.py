"""Token trees: verify several guesses per position in one forward (Medusa, SpecInfer).

A chain proposes one token per position; a tree proposes a few at each and lets
the target pick. Nodes are listed parents first; ``parents[j]`` is node j's
parent (-1: the sequence's newest token, the root). A chain is the tree with
``parents = [-1, 0, 1, ...]``.

    root  <- the newest token: row 0 of the verify chunk
     |- a   (node 0, head 1's top-1)     rows 1.. score the token after each node
     |  `- c (node 2, head 2's top-1 after a)
     `- b   (node 1, head 1's top-2)

The verify chunk packs the root and every node (1 + N query rows). A node sits
at position root + depth; its K/V go to N scratch slots after the root. Its
query sees the cached prefix, the root and its own ancestors, nothing else:
``ancestor_mask`` is that [1 + N, 1 + N] mask over the chunk's own keys, and
the attention backends apply it to the chunk (attention/metadata.py).
After verification one root-to-node path is kept; ``path_kv_moves`` lists the
slot copies that move its K/V to the positions the path now occupies, so the
pool looks exactly as if the path had been decoded one token at a time. For a
chain the path is already in place and nothing moves.

Medusa's trees are templates of top-k ranks per head (Cai et al. 2024,
"medusa_choices"): the path (0, 1) means "head 1's top-1, then head 2's top-2".
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import torch


def chain_parents(n: int) -> list[int]:
    return list(range(-1, n - 1))


def node_depths(parents: list[int]) -> list[int]:
    """Depth of every node below the root (a child of the root has depth 1)."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth


def ancestor_mask(parents: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """bool [1 + N, 1 + N]: row i may attend to column j (j is i itself or an ancestor; 0 is the root)."""
    n = len(parents)
    mask = torch.zeros((n + 1, n + 1), dtype=torch.bool)
    mask[:, 0] = True
    for j, p in enumerate(parents):
        mask[j + 1] = mask[p + 1]
        mask[j + 1, j + 1] = True
    return mask.to(device)


def children(parents: list[int]) -> dict[int, list[int]]:
    """node (-1: root) -> its children, in list order."""
    out: dict[int, list[int]] = {}
    for j, p in enumerate(parents):
        out.setdefault(p, []).append(j)
    return out


def path_kv_moves(block_table: list[int], block_size: int, root_pos: int, path: list[int]) -> list[tuple[int, int]]:
    """(src slot, dst slot) pairs that move an accepted path's K/V to its final positions.

    Node j was written at position root_pos + 1 + j; the path's d-th node (d = 1..) belongs at
    root_pos + d. Sources never lie below their destination and later destinations are
    above earlier sources, so copying in this order is safe in place."""
    def slot(pos: int) -> int:
        return block_table[pos // block_size] * block_size + pos % block_size

    moves = []
    for d, node in enumerate(path, start=1):
        src, dst = root_pos + 1 + node, root_pos + d
        if src != dst:
            moves.append((slot(src), slot(dst)))
    return moves


def tree_kv_moves(batch, chosen, block_size: int) -> list[tuple[int, int]]:
    """Every tree chunk's moves after verification (engine/llm_engine.py applies them)."""
    moves: list[tuple[int, int]] = []
    for c, picked in zip(batch.chunks, chosen):
        if picked is None or not picked.accepted_nodes:
            continue
        root = c.num_computed_before + c.num_new_tokens - 1
        moves += path_kv_moves(c.seq.block_table, block_size, root, picked.accepted_nodes)
    return moves


@dataclass(frozen=True)
class TreeTemplate:
    """A Medusa tree: each node a path of top-k ranks, one rank per head; listed parents first."""

    paths: tuple[tuple[int, ...], ...]

    @classmethod
    def from_spec(cls, spec) -> "TreeTemplate":
        """[3, 2, 1]: widths per depth (head 1's top-3, under each head 2's top-2, ...);
        [[0], [1], [0, 0]]: explicit paths of ranks (Medusa's medusa_choices)."""
        if not isinstance(spec, (list, tuple)) or not spec:
            raise ValueError(f"a tree is a list of widths per depth ([3, 2, 1]) or of rank paths "
                             f"([[0], [1], [0, 0]]), got {spec!r}")
        if all(isinstance(w, int) and not isinstance(w, bool) for w in spec):
            if any(w < 1 for w in spec):
                raise ValueError(f"tree widths must be >= 1, got {list(spec)}")
            paths = [p for d in range(1, len(spec) + 1) for p in product(*(range(w) for w in spec[:d]))]
        elif all(isinstance(p, (list, tuple)) and p and all(isinstance(r, int) and r >= 0 for r in p) for p in spec):
            paths = [tuple(p) for p in spec]
        else:
            raise ValueError(f"a tree is a list of widths per depth ([3, 2, 1]) or of rank paths "
                             f"([[0], [1], [0, 0]]), got {spec!r}")
        if len(set(paths)) != len(paths):
            raise ValueError("tree paths must be distinct")
        known = set(paths)
        for p in paths:
            if len(p) > 1 and p[:-1] not in known:
                raise ValueError(f"tree path {list(p)} has no parent {list(p[:-1])} in the tree")
        return cls(tuple(sorted(paths, key=lambda p: (len(p), p))))  # parents first, a prefix is a tree

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    def topk_per_head(self) -> list[int]:
        """How many candidates each head must rank (1 + the largest rank any path asks of it)."""
        return [1 + max(p[d] for p in self.paths if len(p) > d) for d in range(self.depth)]

    def parents(self, n: int | None = None) -> list[int]:
        """Parent of each of the first n nodes (a prefix of the list is still a tree)."""
        index = {p: j for j, p in enumerate(self.paths)}
        return [index[p[:-1]] if len(p) > 1 else -1 for p in self.paths[:n]]

    def tokens(self, topk: list[list[int]], n: int | None = None) -> list[int]:
        """topk[d]: head d's candidates, best first -> the first n nodes' tokens."""
        return [topk[len(p) - 1][p[-1]] for p in self.paths[:n]]
