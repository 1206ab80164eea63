"""The paged KV pool's bookkeeping: block tables, ref counts, free list, prefix cache.

Physical blocks hold `block_size` tokens of K/V for every layer. A sequence's
block table maps its logical block i (tokens i*bs .. i*bs+bs-1) to a physical
block. Blocks are ref-counted so several sequences can share a prefix.

Prefix caching: when a block becomes full its content is identified by a hash
chained over all tokens up to and including it, hash(parent_hash, tokens). A
new sequence whose leading full blocks hash the same takes those blocks
(ref count + 1) instead of recomputing them. A block whose ref count drops to
0 keeps its content and hash: it sits in the free queue, least recently freed
first, and is only evicted (hash forgotten) when the queue hands it out again.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from minillm.engine.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None  # set once the block is full and registered
    token_ids: tuple[int, ...] = ()  # content behind the hash, checked on a hit


@dataclass
class BlockEvents:
    """What the pool did since the last `take_events`, for the step trace."""

    allocated: list[int] = field(default_factory=list)
    freed: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    shared: list[int] = field(default_factory=list)  # prefix-cache hits
    hit_tokens: int = 0
    queried_tokens: int = 0


def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # ref-count-0 blocks, next to be handed out first (LRU order); dict for O(1) removal on a hit
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.events = BlockEvents()

    # ----- queries -------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Physical blocks holding this sequence's leading full blocks, if cached.

        The last token is never taken from the cache: the step must compute at
        least one token to produce the logits for the next one.
        """
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        parent: int | None = None
        num_full = (seq.num_tokens - 1) // self.block_size
        for i in range(num_full):
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            h = chain_hash(parent, tokens)
            bid = self.hash_to_block.get(h)
            if bid is None or self.blocks[bid].token_ids != tokens:
                break
            hits.append(bid)
            parent = h
        return hits

    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached: list[int] = ()) -> bool:
        """Would `num_new_tokens` more tokens (after taking `cached` blocks) fit in the pool?"""
        have = len(seq.block_table) + len(cached)
        computed = seq.num_computed_tokens + len(cached) * self.block_size
        new_blocks = max(0, self.blocks_needed(computed + num_new_tokens) - have)
        revived = sum(1 for b in cached if self.blocks[b].ref_count == 0)  # they leave the free queue
        return new_blocks + revived <= self.num_free_blocks

    # ----- mutations -----------------------------------------------------------
    def take_cached_prefix(self, seq: Sequence, cached: list[int]) -> None:
        """Share the cached prefix blocks with `seq` and mark those tokens computed."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        for bid in cached:
            block = self.blocks[bid]
            if block.ref_count == 0:
                del self.free_queue[bid]
            block.ref_count += 1
            seq.block_table.append(bid)
            seq.block_hashes.append(block.block_hash)
        self.events.shared.extend(cached)
        seq.num_computed_tokens = len(cached) * self.block_size
        self.events.hit_tokens += seq.num_computed_tokens

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow the block table so tokens up to num_computed + num_new_tokens have slots."""
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need > self.num_free_blocks:
            raise RuntimeError(f"KV pool exhausted: need {need} blocks, {self.num_free_blocks} free")
        for _ in range(need):
            seq.block_table.append(self._pop_free())

    def _pop_free(self) -> int:
        bid, _ = self.free_queue.popitem(last=False)
        block = self.blocks[bid]
        if block.block_hash is not None:  # reusing a cached block forgets what it held
            if self.hash_to_block.get(block.block_hash) == bid:
                del self.hash_to_block[block.block_hash]
            block.block_hash, block.token_ids = None, ()
            self.events.evicted.append(bid)
        block.ref_count = 1
        self.events.allocated.append(bid)
        return bid

    def register_full_blocks(self, seq: Sequence) -> None:
        """After a step: give every newly completed block of `seq` its chained hash."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        for i in range(len(seq.block_hashes), num_full):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            h = chain_hash(parent, tokens)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is None and h not in self.hash_to_block:
                block.block_hash, block.token_ids = h, tokens
                self.hash_to_block[h] = block.block_id

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; tail blocks first so prefixes stay cached longest."""
        for bid in reversed(seq.block_table):
            block = self.blocks[bid]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"double free of block {bid}"
            if block.ref_count == 0:
                if block.block_hash is None:
                    # nothing reusable inside: hand it out before cached blocks
                    self.free_queue[bid] = None
                    self.free_queue.move_to_end(bid, last=False)
                else:
                    self.free_queue[bid] = None
                self.events.freed.append(bid)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def trim(self, seq: Sequence) -> None:
        """Speculative rollback: free the blocks past the computed (accepted) tokens, tail first.

        Only lookahead blocks are dropped; they were allocated this step and never
        registered, so no prefix hash can name a rejected token.
        """
        keep = self.blocks_needed(seq.num_computed_tokens)
        while len(seq.block_table) > keep:
            bid = seq.block_table.pop()
            block = self.blocks[bid]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"double free of block {bid}"
            if block.ref_count == 0:
                self.free_queue[bid] = None
                if block.block_hash is None:
                    self.free_queue.move_to_end(bid, last=False)
                self.events.freed.append(bid)

    def take_events(self) -> BlockEvents:
        ev, self.events = self.events, BlockEvents()
        return ev

    def reset_prefix_cache(self) -> None:
        for block in self.blocks:
            if block.ref_count == 0 and block.block_hash is not None:
                self.hash_to_block.pop(block.block_hash, None)
                block.block_hash, block.token_ids = None, ()

    def check_invariants(self, live: list[Sequence]) -> None:
        """Ref counts equal the number of live block tables naming each block (tests use this)."""
        counts = [0] * self.num_blocks
        for seq in live:
            for bid in seq.block_table:
                counts[bid] += 1
        for block in self.blocks:
            assert block.ref_count == counts[block.block_id], (
                f"block {block.block_id}: ref_count {block.ref_count} but {counts[block.block_id]} tables hold it"
            )
            assert (block.ref_count == 0) == (block.block_id in self.free_queue), f"block {block.block_id} free-list mismatch"
        for h, bid in self.hash_to_block.items():
            assert self.blocks[bid].block_hash == h
