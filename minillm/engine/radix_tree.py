"""A radix tree of token ids over KV blocks: the data structure behind `prefix_cache="radix"`.

Every cached prompt (and generated text) is a path from the root. A node's key
is a run of whole blocks' tokens (len(tokens) == len(block_ids) * block_size),
its value the physical blocks holding their K/V; a node's children are keyed
by their first block's tokens, so two children never start with the same
block and a lookup reads one dict entry per node. Matching a prompt walks down
comparing whole blocks; when it ends inside a node, that node is split at the
block boundary so that "the matched prefix" is always a whole path of nodes.

Locks (as in SGLang's RadixCache): a sequence locks the deepest node of the
path it uses, and a lock counts on that node and every ancestor, so
`lock_ref == 0` implies every descendant is unlocked too. The unlocked nodes
are exactly what can be evicted, leaves first, least recently used first: a
parent never goes before its children, so no cached block is ever stranded
behind an evicted one (the hash chain's weakness: its free queue can hand out
a parent block while the child block's hash stays registered and unreachable).

Time is a counter (`clock`), not wall time: eviction order is deterministic.
This module knows nothing about ref counts or the free queue; the block
manager (radix_cache.py) keeps those and asks the tree what to evict.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterator

from minillm.engine.trace import PrefixTreeNode


@dataclass(eq=False)
class RadixNode:
    node_id: int
    tokens: tuple[int, ...]  # whole blocks' tokens; () only for the root
    block_ids: list[int]
    parent: "RadixNode | None"
    children: dict[tuple[int, ...], "RadixNode"] = field(default_factory=dict)  # first block's tokens -> child
    lock_ref: int = 0  # sequences whose locked node is this one or below it
    last_access: int = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True)
class Match:
    """The longest cached block-aligned prefix: its blocks, and where the path ends."""

    block_ids: list[int]
    node: RadixNode  # the node holding the last matched block (the root: no match)
    num_in_node: int  # how many of node's blocks matched (the rest would be split off)


class RadixTree:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.root = RadixNode(0, (), [], None)
        self.node_of_block: dict[int, RadixNode] = {}
        self.evictable_blocks = 0  # blocks in nodes with lock_ref == 0
        self.clock = 0
        self._next_id = 1

    # ----- reading -------------------------------------------------------------------------
    def match(self, tokens: tuple[int, ...] | list[int]) -> Match:
        """The longest path whose tokens are a prefix of `tokens`, in whole blocks (read only)."""
        bs = self.block_size
        node, i, hits = self.root, 0, []
        while i + bs <= len(tokens):
            child = node.children.get(tuple(tokens[i : i + bs]))
            if child is None:
                break
            k = 1  # the first block matched through the dict key; compare the node's further blocks
            while k < len(child.block_ids) and i + (k + 1) * bs <= len(tokens) and \
                    tuple(tokens[i + k * bs : i + (k + 1) * bs]) == child.tokens[k * bs : (k + 1) * bs]:
                k += 1
            hits.extend(child.block_ids[:k])
            if k < len(child.block_ids):
                return Match(hits, child, k)
            node, i = child, i + k * bs
        return Match(hits, node, len(node.block_ids))

    def depth_blocks(self, node: RadixNode) -> int:
        """Blocks on the path from the root to the end of `node`."""
        n = 0
        while node is not None:
            n += len(node.block_ids)
            node = node.parent
        return n

    def nodes(self) -> Iterator[RadixNode]:
        """Every node, parents before children (depth first, children in insertion order)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children.values()))

    # ----- shaping -------------------------------------------------------------------------
    def _new_node(self, tokens: tuple[int, ...], block_ids: list[int], parent: RadixNode) -> RadixNode:
        node = RadixNode(self._next_id, tokens, block_ids, parent, last_access=self.clock)
        self._next_id += 1
        for bid in block_ids:
            self.node_of_block[bid] = node
        return node

    def split(self, node: RadixNode, k: int) -> RadixNode:
        """Cut `node` after its first k blocks; returns the new upper node (node keeps the rest).

        The original object stays the lower part, so whoever holds it (a sequence's locked node)
        still points at the same end of the path. The upper part inherits the locks: every lock
        on node counts on its ancestors, which now include the upper part.
        """
        assert 0 < k < len(node.block_ids), "split inside a node, at a block boundary"
        bs = self.block_size
        upper = self._new_node(node.tokens[: k * bs], node.block_ids[:k], node.parent)
        upper.lock_ref, upper.last_access = node.lock_ref, node.last_access
        node.parent.children[node.tokens[:bs]] = upper
        node.tokens, node.block_ids = node.tokens[k * bs :], node.block_ids[k:]
        upper.children[node.tokens[:bs]] = node
        node.parent = upper
        return upper

    def node_at(self, m: Match) -> RadixNode:
        """The node ending exactly where the match ends (splitting one if the match stopped inside it)."""
        if m.num_in_node < len(m.node.block_ids):
            return self.split(m.node, m.num_in_node)
        return m.node

    def ancestor_at(self, node: RadixNode, depth: int) -> RadixNode:
        """The node ending `depth` blocks below the root on node's path (splitting one if needed)."""
        end = self.depth_blocks(node)
        assert depth <= end
        while node is not self.root and end - len(node.block_ids) >= depth:
            end -= len(node.block_ids)
            node = node.parent
        if end > depth:  # depth falls inside node
            return self.split(node, len(node.block_ids) - (end - depth))
        return node

    def extend(self, node: RadixNode, tokens: tuple[int, ...], bid: int) -> tuple[RadixNode, bool]:
        """A sequence locking `node` completed the block `bid` holding `tokens`, the next block on its path.

        Returns (the sequence's new locked node, whether `bid` entered the tree). The lock moves
        from node to the node holding those tokens. If the tree already has them (another sequence
        computed the same block at the same time), `bid` stays the sequence's private copy.
        """
        assert len(tokens) == self.block_size and bid not in self.node_of_block
        self.clock += 1
        child = node.children.get(tokens)
        if child is not None:  # cached already: follow it
            target = child if len(child.block_ids) == 1 else self.split(child, 1)
            self._move_lock(node, target)
            target.last_access = self.clock
            return target, False
        if node is not self.root and node.is_leaf and node.lock_ref == 1:  # only this sequence ends here: grow
            node.tokens += tokens
            node.block_ids.append(bid)
            self.node_of_block[bid] = node
            node.last_access = self.clock
            return node, True
        child = self._new_node(tokens, [bid], node)
        node.children[tokens] = child
        child.lock_ref = 1  # the moved lock (a new node's blocks were never evictable)
        return child, True

    # ----- locks and recency ---------------------------------------------------------------
    def lock(self, node: RadixNode) -> None:
        while node is not None:
            if node.lock_ref == 0:
                self.evictable_blocks -= len(node.block_ids)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not None:
            node.lock_ref -= 1
            assert node.lock_ref >= 0, f"radix node {node.node_id} unlocked more often than locked"
            if node.lock_ref == 0:
                self.evictable_blocks += len(node.block_ids)
            node = node.parent

    def _move_lock(self, src: RadixNode, dst: RadixNode) -> None:
        """dst is a child of src: a lock ending at src now ends at dst (src and above count it either way)."""
        assert dst.parent is src
        if dst.lock_ref == 0:
            self.evictable_blocks -= len(dst.block_ids)
        dst.lock_ref += 1

    def touch(self, node: RadixNode) -> None:
        """A hit: the path to node was used now."""
        self.clock += 1
        while node is not None:
            node.last_access = self.clock
            node = node.parent

    # ----- eviction --------------------------------------------------------------------------
    def evict(self, num_blocks: int) -> list[int]:
        """Drop up to num_blocks cached blocks: unlocked leaves, least recently used first, tail first."""
        heap = [(n.last_access, n.node_id, n) for n in self.nodes()
                if n is not self.root and n.is_leaf and n.lock_ref == 0]
        heapq.heapify(heap)
        out: list[int] = []
        bs = self.block_size
        while heap and len(out) < num_blocks:
            _, _, leaf = heapq.heappop(heap)
            key = leaf.tokens[:bs]
            while leaf.block_ids and len(out) < num_blocks:
                bid = leaf.block_ids.pop()
                leaf.tokens = leaf.tokens[:-bs]
                del self.node_of_block[bid]
                out.append(bid)
            if leaf.block_ids:
                break  # enough: the leaf keeps its head
            parent = leaf.parent
            del parent.children[key]
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        self.evictable_blocks -= len(out)
        return out

    def eviction_order(self) -> list[int]:
        """The evictable blocks in the order `evict` would hand them out (read only, for the views)."""
        left = {n.node_id: len(n.children) for n in self.nodes()}
        heap = [(n.last_access, n.node_id, n) for n in self.nodes()
                if n is not self.root and n.is_leaf and n.lock_ref == 0]
        heapq.heapify(heap)
        out: list[int] = []
        while heap:
            _, _, leaf = heapq.heappop(heap)
            out.extend(reversed(leaf.block_ids))
            parent = leaf.parent
            left[parent.node_id] -= 1
            if parent is not self.root and not left[parent.node_id] and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return out

    # ----- for the trace and the tests -------------------------------------------------------
    def snapshot(self, max_label_tokens: int = 4) -> tuple[PrefixTreeNode, ...]:
        """One record per node (root first, parents before children): cheap enough for every step."""
        return tuple(
            PrefixTreeNode(n.node_id, n.parent.node_id if n.parent is not None else -1, len(n.tokens),
                           tuple(n.block_ids), n.lock_ref, n.last_access, n.tokens[:max_label_tokens])
            for n in self.nodes())

    def check(self) -> None:
        """Structural invariants (tests call this after every operation)."""
        bs = self.block_size
        seen: dict[int, RadixNode] = {}
        evictable = 0
        for n in self.nodes():
            if n is not self.root:
                assert n.block_ids and len(n.tokens) == len(n.block_ids) * bs, f"node {n.node_id}: ragged key"
                assert n.parent.children.get(n.tokens[:bs]) is n, f"node {n.node_id}: wrong key in its parent"
                assert n.lock_ref >= sum(c.lock_ref for c in n.children.values()), f"node {n.node_id}: locks"
            for key, c in n.children.items():
                assert c.parent is n and c.tokens[:bs] == key
            for bid in n.block_ids:
                assert bid not in seen, f"block {bid} in two nodes"
                seen[bid] = n
            if n.lock_ref == 0:
                evictable += len(n.block_ids)
        assert seen == self.node_of_block, "node_of_block out of date"
        assert evictable == self.evictable_blocks, f"evictable {self.evictable_blocks}, counted {evictable}"
