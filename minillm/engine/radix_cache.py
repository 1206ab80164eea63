"""RadixBlockManager: the paged pool with a radix tree as its prefix cache (`prefix_cache="radix"`).

The same pool as BlockManager (block_manager.py): the same Block objects, ref
counts (= live block tables naming a block), free queue and events, and the
same API the scheduler calls (find_cached_prefix, can_allocate,
take_cached_prefix, allocate, register_full_blocks, share_prefix, trim, free).
Only the prefix cache differs:

- hash: a full block is named by a hash chained over all tokens up to it; a
  freed block keeps its hash in the free queue (least recently freed first) and
  is forgotten when the queue hands it out again.
- radix: full blocks are inserted into a token tree (radix_tree.py); a block in
  the tree never sits in the free queue. A sequence locks the path it uses; when
  the free queue runs dry, allocation evicts unlocked leaves, least recently
  used first. A hit compares the token ids themselves, so no collision is
  possible and no digest is computed.

Every block is in exactly one of three places: the free queue (ref 0, nothing
cached), the tree (ref >= 0; evictable when its node is unlocked), or a
sequence's private blocks (ref > 0: a partial block, a lookahead slot, or a
full block another sequence had already put in the tree). `num_free_blocks`
counts the free queue plus the evictable tree blocks: what `allocate` can get.

The hash path takes no extra keys today (no adapters): a hit depends on the
token ids alone in both caches. A future extra key (a LoRA id, an image hash)
would have to pick a separate root per key here.
"""
from __future__ import annotations

from collections import Counter

from minillm.engine.block_manager import Block, BlockManager
from minillm.engine.radix_tree import RadixNode, RadixTree
from minillm.engine.sequence import Sequence


class RadixBlockManager(BlockManager):
    memoize_snapshot = False  # its own state changes without BlockManager.version (see block_snapshot)

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching=True)
        self.tree = RadixTree(block_size)
        # seq_id -> (the node the sequence locks, how many of its leading blocks the tree path covers)
        self.paths: dict[int, tuple[RadixNode, int]] = {}

    # ----- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue) + self.tree.evictable_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """The tree's blocks for the longest cached block-aligned prefix, never the last token."""
        n = (seq.num_tokens - 1) // self.block_size * self.block_size
        return self.tree.match(seq.token_ids[:n]).block_ids

    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached: list[int] = ()) -> bool:
        have = len(seq.block_table) + len(cached)
        computed = seq.num_computed_tokens + len(cached) * self.block_size
        new_blocks = max(0, self.blocks_needed(computed + num_new_tokens) - have)
        # taking the hit locks its path: blocks of unlocked nodes stop being evictable
        locked_now = sum(1 for b in cached if self.tree.node_of_block[b].lock_ref == 0)
        return new_blocks + locked_now <= self.num_free_blocks

    # ----- mutations -----------------------------------------------------------------------
    def take_cached_prefix(self, seq: Sequence, cached: list[int]) -> None:
        assert not seq.block_table and seq.num_computed_tokens == 0 and seq.seq_id not in self.paths
        node = self.tree.root
        if cached:  # the path must end at the last hit block: split its node there if it goes on
            node = self.tree.node_of_block[cached[-1]]
            k = node.block_ids.index(cached[-1]) + 1
            if k < len(node.block_ids):
                node = self.tree.split(node, k)
        self.tree.lock(node)
        self.tree.touch(node)
        self.paths[seq.seq_id] = (node, len(cached))
        for bid in cached:
            self._ref(bid)
            seq.block_table.append(bid)
        self.events.shared.extend(cached)
        seq.num_computed_tokens = len(cached) * self.block_size
        self.events.hit_tokens += seq.num_computed_tokens

    def share_prefix(self, child: Sequence, parent: Sequence, num_blocks: int) -> None:
        """n > 1: as BlockManager.share_prefix, and the child locks the parent's path up to those blocks."""
        super().share_prefix(child, parent, num_blocks)
        child.block_hashes = []
        if not num_blocks:
            return  # nothing shared: the child's path starts at the root when it allocates
        pnode, pdone = self._path(parent)
        depth = min(num_blocks, pdone)
        node = self.tree.ancestor_at(pnode, depth)
        self.tree.lock(node)
        self.paths[child.seq_id] = (node, depth)

    def _path(self, seq: Sequence) -> tuple[RadixNode, int]:
        """The sequence's locked path (a sequence admitted without a hit starts at the root)."""
        got = self.paths.get(seq.seq_id)
        if got is None:
            self.tree.lock(self.tree.root)
            got = self.paths[seq.seq_id] = (self.tree.root, 0)
        return got

    def _ref(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count == 0 and bid not in self.tree.node_of_block:
            del self.free_queue[bid]
        block.ref_count += 1

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        self._path(seq)
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        short = need - len(self.free_queue)
        if 0 < short <= self.tree.evictable_blocks:
            evicted = self.tree.evict(short)
            for bid in evicted:  # to the queue's front: handed out right below
                self.free_queue[bid] = None
                self.free_queue.move_to_end(bid, last=False)
            self.events.evicted.extend(evicted)
        super().allocate(seq, num_new_tokens)

    def register_full_blocks(self, seq: Sequence) -> None:
        """After a step: insert the sequence's newly completed blocks into the tree, moving its lock down."""
        node, done = self._path(seq)
        bs = self.block_size
        num_full = min(seq.num_computed_tokens, seq.num_tokens) // bs
        for i in range(done, num_full):
            node, _ = self.tree.extend(node, tuple(seq.token_ids[i * bs : (i + 1) * bs]), seq.block_table[i])
        if num_full > done:
            self.paths[seq.seq_id] = (node, num_full)

    def free(self, seq: Sequence) -> None:
        super().free(seq)  # the table's references (tree blocks stay in the tree)
        got = self.paths.pop(seq.seq_id, None)
        if got is not None:
            self.tree.unlock(got[0])

    def trim(self, seq: Sequence) -> None:
        keep = self.blocks_needed(seq.num_computed_tokens)
        assert self.paths.get(seq.seq_id, (None, 0))[1] <= keep, "trim would drop a block in the tree"
        self._release_tail(seq, keep)

    def _park(self, bid: int, block: Block) -> None:
        """A block in the tree stays there at ref count 0 (evictable, not queued); any other is handed out next."""
        if bid not in self.tree.node_of_block:
            self.free_queue[bid] = None
            self.free_queue.move_to_end(bid, last=False)

    # ----- the trace ---------------------------------------------------------------------------
    def cached_flags(self) -> tuple[bool, ...]:
        return tuple(b in self.tree.node_of_block for b in range(self.num_blocks))

    def free_order(self) -> tuple[int, ...]:
        return tuple(self.free_queue) + tuple(self.tree.eviction_order())

    def prefix_tree_snapshot(self) -> tuple:
        return self.tree.snapshot()

    def check_invariants(self, live: list[Sequence]) -> None:
        """No leak, no double free: every block in exactly one place, ref counts and locks as the tables say."""
        counts = Counter(bid for seq in live for bid in seq.block_table)
        self.tree.check()
        in_tree = self.tree.node_of_block
        for block in self.blocks:
            bid = block.block_id
            assert block.ref_count == counts[bid], f"block {bid}: ref_count {block.ref_count}, {counts[bid]} tables"
            assert not (bid in in_tree and bid in self.free_queue), f"block {bid} both cached and queued"
            if block.ref_count == 0:
                assert bid in in_tree or bid in self.free_queue, f"block {bid} leaked (ref 0, nowhere)"
            else:
                assert bid not in self.free_queue, f"block {bid} queued while in use"
            assert block.block_hash is None
        # each live sequence with blocks locks one path; a node's lock_ref counts the paths through it
        holders = {s.seq_id for s in live if s.block_table}
        assert set(self.paths) == holders, f"locked paths {sorted(self.paths)} vs holders {sorted(holders)}"
        expected: Counter[int] = Counter()
        for node, done in self.paths.values():
            assert self.tree.depth_blocks(node) == done, "a sequence's path ends off its block boundary"
            while node is not None:
                expected[node.node_id] += 1
                node = node.parent
        for node in self.tree.nodes():
            assert node.lock_ref == expected[node.node_id], f"radix node {node.node_id}: lock_ref {node.lock_ref}"
        # and a live sequence's tree path spells its own leading tokens
        for s in live:
            if s.seq_id in self.paths:
                node, done = self.paths[s.seq_id]
                toks: list[int] = []
                while node is not None:
                    toks[:0] = node.tokens
                    node = node.parent
                assert toks == s.token_ids[: done * self.block_size], f"seq {s.seq_id}: path is not its prefix"
