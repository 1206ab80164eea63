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

Why sha256 by default: a prefix-cache hit hands a sequence K/V that some other
prompt computed. If two different token chains ever hash alike, the second
prompt is silently served the first one's KV -- wrong output, no error, and
across requests (one user's context leaking into another's answer). Python's
`hash` of a tuple is a 64-bit, unkeyed, non-cryptographic value (ints reduce mod
2**61 - 1; hash(-1) == hash(-2)): collisions can be constructed on purpose, so a
crafted prompt could poison a shared cache. The default digest is therefore
sha256 over the parent's 32-byte digest, the block's token ids and any extra
keys, as vLLM does with its sha256 option. The cost is small next to any forward
pass: per 16-token block 1.0 us against 0.2 us for the builtin hash (256 tokens:
4.0 vs 0.9 us); registering and then looking up a 2048-token prompt takes 0.34
ms against 0.12 ms (one CPU thread; `python tests/test_prefix_hash.py` measures
it). `hash_algo="builtin"` keeps Python's hash for whoever prefers the speed.
With either, a hit is also checked against the block's stored token ids, which
catches a collision within a block but not one in a parent (the parent's tokens
are not stored along the chain).
"""
from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from minillm.engine.sequence import Sequence

BlockHash = bytes | int  # sha256: a 32-byte digest; builtin: Python's int hash
TokenIds = tuple[int, ...] | list[int]


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None  # set once the block is full and registered
    token_ids: tuple[int, ...] = ()  # content behind the hash, checked on a hit


@dataclass
class BlockEvents:
    """What the pool did since the last `take_events`, for the step trace."""

    allocated: list[int] = field(default_factory=list)
    freed: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    shared: list[int] = field(default_factory=list)  # prefix-cache hits and shared parent blocks
    hit_tokens: int = 0
    queried_tokens: int = 0


# ----- the chained block hash ---------------------------------------------------------------
HASH_ALGOS = ("sha256", "builtin")  # the values of EngineConfig.prefix_caching_hash_algo

# The parent of a sequence's first block: a fixed 32-byte marker, the same width as a digest, so
# the message layout below is the same for every block. Only a sha256 preimage could forge it.
ROOT_HASH = hashlib.sha256(b"minillm prefix cache: no parent block").digest()

_packers: dict[int, struct.Struct] = {}


def _packer(n: int) -> struct.Struct:
    p = _packers.get(n)
    if p is None:  # one compiled format per block length (in practice one: block_size)
        p = _packers[n] = struct.Struct(f"<q{n}q")
    return p


def sha256_chain_hash(parent: bytes | None, tokens: TokenIds, extra_keys: tuple | None = None) -> bytes:
    """sha256(parent digest | token count | token ids | extra keys), each field unambiguous.

    The message: the parent's 32-byte digest (ROOT_HASH for the first block), the token count as
    a little-endian int64, the ids as little-endian int64 (struct: the fastest of array, struct and
    numpy measured), then, only when given, repr(extra_keys) (ints, strs, bytes and tuples of them
    have a deterministic repr). The fixed-width parent and the count make every split unique.
    """
    n = len(tokens)
    msg = (ROOT_HASH if parent is None else parent) + _packer(n).pack(n, *tokens)
    if extra_keys is not None:
        msg += repr(extra_keys).encode()
    return hashlib.sha256(msg).digest()


def builtin_chain_hash(parent: int | None, tokens: TokenIds, extra_keys: tuple | None = None) -> int:
    """Python's hash: fast, 64-bit, not collision-resistant (the pre-sha256 behaviour)."""
    key = (parent, tuple(tokens)) if extra_keys is None else (parent, tuple(tokens), extra_keys)
    return hash(key)


HASH_FUNCTIONS: dict[str, Callable[..., BlockHash]] = {"sha256": sha256_chain_hash, "builtin": builtin_chain_hash}

# The two seams of exercise 01 (exercises/ex01_block_hash.py): a BlockManager calls these module
# names, so minillm.exercises.use("learner") can rebind them to the learner's code. The digest
# function is read when a pool is built (one pool, one digest function); the walk at every lookup.
chain_block_hash: Callable[[BlockHash | None, TokenIds], BlockHash] = sha256_chain_hash


def cached_prefix_blocks(token_ids: TokenIds, block_size: int, hash_fn: Callable[..., BlockHash],
                         lookup: Callable[[BlockHash, tuple[int, ...]], int | None]) -> list[int]:
    """Physical blocks holding the leading full blocks of `token_ids`, walking the hash chain.

    Stops at the first block `lookup(digest, tokens)` does not find. Never covers the last token:
    the step must compute at least one token to produce the logits for the next one.
    """
    hits: list[int] = []
    parent: BlockHash | None = None
    for i in range((len(token_ids) - 1) // block_size):
        tokens = tuple(token_ids[i * block_size : (i + 1) * block_size])
        h = hash_fn(parent, tokens)
        bid = lookup(h, tokens)
        if bid is None:
            break
        hits.append(bid)
        parent = h
    return hits
PREFIX_CACHES = ("hash", "radix")  # the values of EngineConfig.prefix_cache: this hash chain, or radix_cache.py


def chain_hash(parent: BlockHash | None, tokens: TokenIds, extra_keys: tuple | None = None,
               algo: str = "sha256") -> BlockHash:
    """The hash of a full block given its parent block's hash (None for the first block)."""
    return HASH_FUNCTIONS[algo](parent, tokens, extra_keys)


def hash_chain(token_ids: TokenIds, block_size: int, algo: str = "sha256") -> list[BlockHash]:
    """The hashes of every full block of `token_ids`, first block first."""
    fn = HASH_FUNCTIONS[algo]
    out: list[BlockHash] = []
    parent = None
    for i in range(len(token_ids) // block_size):
        parent = fn(parent, tuple(token_ids[i * block_size : (i + 1) * block_size]))
        out.append(parent)
    return out


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 hash_algo: str = "sha256") -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        if hash_algo not in HASH_FUNCTIONS:
            raise ValueError(f"hash_algo must be one of {HASH_ALGOS}, got {hash_algo!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_algo = hash_algo
        self._hash = chain_block_hash if hash_algo == "sha256" else HASH_FUNCTIONS[hash_algo]
        self.blocks = [Block(i) for i in range(num_blocks)]
        # ref-count-0 blocks, next to be handed out first (LRU order); dict for O(1) removal on a hit
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[BlockHash, int] = {}
        self.events = BlockEvents()
        # bumped by every change to a ref count, a block's hash or the free queue: the step trace's
        # per-block snapshot is rebuilt only after one (most decode steps change nothing)
        self.version = 0
        self._snapshot: tuple | None = None

    # ----- queries -------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def hash_block(self, parent: BlockHash | None, tokens: TokenIds) -> BlockHash:
        """This pool's chained hash of one full block (`hash_algo`), e.g. to check the cache."""
        return self._hash(parent, tokens)

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Physical blocks holding this sequence's leading full blocks, if cached.

        The last token is never taken from the cache: the step must compute at
        least one token to produce the logits for the next one.
        """
        if not self.enable_prefix_caching:
            return []
        return cached_prefix_blocks(seq.token_ids, self.block_size, self._hash, self._cached_block)

    def _cached_block(self, digest: BlockHash, tokens: tuple[int, ...]) -> int | None:
        """The block registered under `digest`, if it holds exactly `tokens` (a collision check)."""
        bid = self.hash_to_block.get(digest)
        return bid if bid is not None and self.blocks[bid].token_ids == tokens else None

    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached: list[int] = ()) -> bool:
        """Would `num_new_tokens` more tokens (after taking `cached` blocks) fit in the pool?"""
        have = len(seq.block_table) + len(cached)
        computed = seq.num_computed_tokens + len(cached) * self.block_size
        new_blocks = max(0, self.blocks_needed(computed + num_new_tokens) - have)
        revived = sum(1 for b in cached if self.blocks[b].ref_count == 0)  # they leave the free queue
        return new_blocks + revived <= self.num_free_blocks

    # ----- mutations -----------------------------------------------------------
    def note_prefix_query(self, num_tokens: int) -> None:
        """Count prompt tokens looked up in the prefix cache (the hit rate's denominator)."""
        if self.enable_prefix_caching:
            self.events.queried_tokens += num_tokens

    def take_cached_prefix(self, seq: Sequence, cached: list[int]) -> None:
        """Share the cached prefix blocks with `seq` and mark those tokens computed."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        for bid in cached:
            self._ref(bid)
            seq.block_table.append(bid)
            seq.block_hashes.append(self.blocks[bid].block_hash)
        self.events.shared.extend(cached)
        seq.num_computed_tokens = len(cached) * self.block_size
        self.events.hit_tokens += seq.num_computed_tokens

    def share_prefix(self, child: Sequence, parent: Sequence, num_blocks: int) -> None:
        """n > 1: `child` takes `parent`'s first `num_blocks` blocks (full, computed) and their hashes.

        Works with prefix caching off too (the blocks are shared by reference, not found by hash).
        The child's num_computed_tokens becomes num_blocks * block_size; the caller sets
        num_cached_tokens.
        """
        assert not child.block_table and child.num_computed_tokens == 0, "child already holds blocks"
        assert 0 <= num_blocks <= len(parent.block_table), "parent holds fewer blocks"
        assert num_blocks * self.block_size <= parent.num_computed_tokens, "sharing uncomputed blocks"
        shared = parent.block_table[:num_blocks]
        for bid in shared:
            self._ref(bid)
        self.events.shared.extend(shared)
        child.block_table = list(shared)
        child.block_hashes = list(parent.block_hashes[:num_blocks])
        child.num_computed_tokens = num_blocks * self.block_size

    def _ref(self, bid: int) -> None:
        self.version += 1
        block = self.blocks[bid]
        if block.ref_count == 0:  # a cached block revived from the free queue
            del self.free_queue[bid]
        block.ref_count += 1

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow the block table so tokens up to num_computed + num_new_tokens have slots."""
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need > self.num_free_blocks:
            raise RuntimeError(f"KV pool exhausted: need {need} blocks, {self.num_free_blocks} free")
        for _ in range(need):
            seq.block_table.append(self._pop_free())

    def _pop_free(self) -> int:
        self.version += 1
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
        bs = self.block_size
        num_full = min(seq.num_computed_tokens, seq.num_tokens) // bs
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        for i in range(len(seq.block_hashes), num_full):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = parent = self._hash(parent, tokens)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is None and h not in self.hash_to_block:
                block.block_hash, block.token_ids = h, tokens
                self.hash_to_block[h] = block.block_id
                self.version += 1

    def free(self, seq: Sequence) -> None:
        """Drop all the sequence's references (finish, abort, preemption); it restarts from scratch."""
        self._release_tail(seq, 0)
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def trim(self, seq: Sequence) -> None:
        """Speculative rollback: free the blocks past the computed (accepted) tokens, tail first.

        Only lookahead blocks are dropped; they were allocated this step and never
        registered, so no prefix hash can name a rejected token. The sequence keeps
        its hashes and computed tokens.
        """
        keep = self.blocks_needed(seq.num_computed_tokens)
        assert len(seq.block_hashes) <= keep, "trim would drop a registered block"
        self._release_tail(seq, keep)

    def _release_tail(self, seq: Sequence, keep: int) -> None:
        """The one release path: drop seq's blocks past the first `keep`, tail first.

        A block whose ref count reaches 0 enters the free queue: uncached (nothing reusable
        inside) at the front, handed out next; cached at the back, so it survives longest.
        Tail first, so a sequence's prefix blocks are the last of its cached blocks evicted.
        """
        table = seq.block_table
        while len(table) > keep:
            bid = table.pop()
            block = self.blocks[bid]
            block.ref_count -= 1
            self.version += 1
            assert block.ref_count >= 0, f"double free of block {bid}"
            if block.ref_count == 0:
                self._park(bid, block)
                self.events.freed.append(bid)

    def _park(self, bid: int, block: Block) -> None:
        """Where a block goes when its last user lets go (the radix manager keeps tree blocks in its tree)."""
        self.free_queue[bid] = None
        if block.block_hash is None:
            self.free_queue.move_to_end(bid, last=False)

    def take_events(self) -> BlockEvents:
        ev, self.events = self.events, BlockEvents()
        return ev

    # ----- what the step trace records (the radix cache answers these from its tree) -----------
    # a subclass that keeps state of its own (the radix tree, contiguous reservations) rebuilds every step
    memoize_snapshot = True

    def block_snapshot(self) -> tuple[tuple[int, ...], tuple[bool, ...], tuple[int, ...]]:
        """(ref count per block, cached_flags(), free_order()) for the step trace. Rebuilt only when
        `version` moved: the three are O(num_blocks) each, ~55 us a step at 728 blocks (3% of a
        quantized batch-1 step of the default model), and a decode step rarely changes them."""
        snap = self._snapshot
        if snap is None or snap[0] != self.version or not self.memoize_snapshot:
            snap = self._snapshot = (self.version, tuple(b.ref_count for b in self.blocks), self.cached_flags(),
                                     self.free_order())
        return snap[1], snap[2], snap[3]

    def cached_flags(self) -> tuple[bool, ...]:
        """Per physical block: does it hold reusable prefix content?"""
        return tuple(b.block_hash is not None for b in self.blocks)

    def free_order(self) -> tuple[int, ...]:
        """Ref-count-0 blocks in the order they would be handed out."""
        return tuple(self.free_queue)

    def prefix_tree_snapshot(self) -> tuple:
        return ()  # a hash chain has no tree

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
            assert (block.ref_count == 0) == (block.block_id in self.free_queue), (
                f"block {block.block_id} free-list mismatch")
        for h, bid in self.hash_to_block.items():
            assert self.blocks[bid].block_hash == h
