"""The prefix cache's chained block hash, and the BlockManager methods the scheduler calls.

`python tests/test_prefix_hash.py` prints the hash's cost per block (sha256 vs builtin).
"""
import hashlib
import struct

import pytest

from minillm.engine.block_manager import (HASH_ALGOS, ROOT_HASH, BlockManager, builtin_chain_hash, chain_hash,
                                          hash_chain, sha256_chain_hash)
from minillm.engine.sequence import Sequence
from minillm.sampling_params import SamplingParams


def make_seq(tokens, seq_id=0):
    return Sequence(seq_id, f"r{seq_id}", 0, list(tokens), len(tokens), SamplingParams(), 0.0)


def run_prefill(bm, seq):
    """What a step does for a whole-prompt chunk: slots, compute, register."""
    cached = bm.find_cached_prefix(seq)
    if cached:
        bm.take_cached_prefix(seq, cached)
    bm.allocate(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.register_full_blocks(seq)
    return cached


# ----- the hash itself --------------------------------------------------------------------
def test_sha256_is_the_default_and_its_message_layout():
    bm = BlockManager(4, 4)
    assert bm.hash_algo == "sha256"
    toks = (1, 2, 50_000, 2**40)
    h0 = chain_hash(None, toks)
    assert h0 == hashlib.sha256(ROOT_HASH + struct.pack("<5q", 4, *toks)).digest() and len(h0) == 32
    h1 = chain_hash(h0, (7, 8, 9, 10))
    assert h1 == hashlib.sha256(h0 + struct.pack("<5q", 4, 7, 8, 9, 10)).digest()
    assert sha256_chain_hash(None, list(toks)) == h0  # a list slice hashes like the tuple
    assert hash_chain(list(toks) + [7, 8, 9, 10, 11], 4) == [h0, h1]
    assert bm.hash_block(None, toks) == h0


def test_builtin_is_pythons_hash():
    assert chain_hash(None, (1, 2), algo="builtin") == builtin_chain_hash(None, (1, 2)) == hash((None, (1, 2)))
    assert BlockManager(4, 4, hash_algo="builtin").hash_block(5, [3]) == hash((5, (3,)))


def test_sha256_fields_do_not_run_together():
    base = chain_hash(None, (1, 2))
    variants = [chain_hash(None, (1, 2, 0)), chain_hash(None, (2, 1)), chain_hash(None, ()), chain_hash(base, (1, 2)),
                chain_hash(None, (1, 2), ()), chain_hash(None, (1, 2), ("lora", 1)),
                chain_hash(None, (1, 2), ("lora", 2)),
                chain_hash(None, (1, 2), (b"salt",)), chain_hash(None, (1 + 2**32,)), chain_hash(ROOT_HASH, (1, 2))]
    digests = [base] + variants[:-1]
    assert len(set(digests)) == len(digests)
    # ROOT_HASH is what "no parent" means: passing it explicitly is the same first block
    assert variants[-1] == base


def test_builtin_collides_where_sha256_does_not():
    # CPython hashes -1 and -2 alike, so their tuples collide: an example of why builtin is not the default
    assert chain_hash(None, (-1,), algo="builtin") == chain_hash(None, (-2,), algo="builtin")
    assert chain_hash(None, (-1,)) != chain_hash(None, (-2,))


def test_unknown_algo_is_refused_and_matches_the_engine_option():
    from minillm.engine.config import PREFIX_HASH_ALGOS

    assert HASH_ALGOS == PREFIX_HASH_ALGOS
    with pytest.raises(ValueError, match="hash_algo"):
        BlockManager(4, 4, hash_algo="md5")


# ----- the cache with each hash ------------------------------------------------------------
@pytest.mark.parametrize("algo,kind", [("sha256", bytes), ("builtin", int)])
def test_prefix_hit_with_each_algo(algo, kind):
    bm = BlockManager(8, 4, hash_algo=algo)
    a = make_seq(range(10), 0)
    assert run_prefill(bm, a) == []
    assert [type(h) for h in a.block_hashes] == [kind, kind]
    assert a.block_hashes == hash_chain(a.token_ids, 4, algo)
    b = make_seq(list(range(8)) + [99, 98, 97], 1)
    hits = run_prefill(bm, b)
    assert hits == a.block_table[:2] and b.num_computed_tokens == 11
    assert bm.blocks[hits[0]].ref_count == 2
    bm.check_invariants([a, b])


def test_a_hash_collision_is_refused_by_the_token_check():
    bm = BlockManager(8, 4)
    bm._hash = lambda parent, tokens: b"\0" * 32  # every block collides
    a = make_seq([1, 2, 3, 4, 5], 0)
    run_prefill(bm, a)
    assert bm.find_cached_prefix(make_seq([9, 9, 9, 9, 5], 1)) == []  # same hash, other tokens: a miss
    assert bm.find_cached_prefix(make_seq([1, 2, 3, 4, 6], 2)) == a.block_table[:1]


# ----- methods the scheduler calls -----------------------------------------------------------
@pytest.mark.parametrize("caching", [True, False])
def test_share_prefix(caching):
    bm = BlockManager(10, 4, enable_prefix_caching=caching)
    parent = make_seq(range(14), 0)
    run_prefill(bm, parent)
    bm.take_events()
    child = make_seq(range(14), 1)
    bm.share_prefix(child, parent, 3)
    assert child.block_table == parent.block_table[:3] and child.num_computed_tokens == 12
    assert child.block_hashes == parent.block_hashes[:3] == (hash_chain(child.token_ids, 4) if caching else [])
    assert [bm.blocks[b].ref_count for b in parent.block_table] == [2, 2, 2, 1]
    assert bm.take_events().shared == parent.block_table[:3]
    bm.check_invariants([parent, child])
    with pytest.raises(AssertionError):
        bm.share_prefix(child, parent, 1)  # the child already holds blocks


def test_note_prefix_query_counts_only_with_caching():
    on, off = BlockManager(4, 4), BlockManager(4, 4, enable_prefix_caching=False)
    for bm in (on, off):
        bm.note_prefix_query(7)
        bm.note_prefix_query(5)
    assert on.take_events().queried_tokens == 12 and off.take_events().queried_tokens == 0


def test_free_queue_order_uncached_first_cached_last_tail_first():
    bm = BlockManager(8, 2)
    seq = make_seq(range(7), 0)  # blocks 0..3: three full (cached), one partial
    run_prefill(bm, seq)
    seq.num_computed_tokens = 7
    bm.allocate(seq, 4)  # two more, uncached: 4, 5
    assert seq.block_table == [0, 1, 2, 3, 4, 5]
    assert [bm.blocks[b].block_hash is not None for b in seq.block_table] == [True] * 3 + [False] * 3
    bm.free(seq)
    # uncached to the front (tail first, so the earliest ends up first), cached to the back (tail first)
    assert list(bm.free_queue) == [3, 4, 5, 6, 7, 2, 1, 0]
    assert seq.block_table == [] and seq.block_hashes == [] and seq.num_computed_tokens == 0
    assert bm.take_events().freed == [5, 4, 3, 2, 1, 0]


def test_trim_drops_lookahead_blocks_and_keeps_the_rest():
    bm = BlockManager(8, 2)
    seq = make_seq(range(5), 0)
    run_prefill(bm, seq)  # 5 tokens: blocks 0, 1 cached, 2 partial
    hashes = list(seq.block_hashes)
    bm.allocate(seq, 1 + 4)  # a decode of 1 with 4 lookahead slots: blocks 3, 4
    assert seq.block_table == [0, 1, 2, 3, 4]
    bm.take_events()
    seq.num_computed_tokens += 1 + 1  # the decode and one accepted draft: 7 tokens, 4 blocks
    bm.trim(seq)
    assert seq.block_table == [0, 1, 2, 3] and seq.num_computed_tokens == 7 and seq.block_hashes == hashes
    assert list(bm.free_queue)[0] == 4 and bm.take_events().freed == [4]
    bm.trim(seq)  # nothing more to drop
    assert seq.block_table == [0, 1, 2, 3]
    bm.check_invariants([seq])


# ----- cost ----------------------------------------------------------------------------------
def bench(repeats=41, inner=2000):
    import random
    import statistics
    import timeit

    rng = random.Random(0)
    print("chain_hash per block (median of", repeats, "x", inner, "calls):")
    for n in (16, 256):
        toks = tuple(rng.randrange(128_000) for _ in range(n))
        for algo in HASH_ALGOS:
            parent = chain_hash(None, toks, algo=algo)
            fn = BlockManager(1, n, hash_algo=algo).hash_block
            t = statistics.median(timeit.repeat(lambda: fn(parent, toks), number=inner, repeat=repeats)) / inner
            print(f"  {n:4d} tokens  {algo:8s} {t * 1e6:7.3f} us")
    print("register_full_blocks + find_cached_prefix, 2048-token prompt, block_size 16 (median):")
    prompt = [rng.randrange(128_000) for _ in range(2048)]
    for algo in HASH_ALGOS:
        def once():
            bm = BlockManager(256, 16, hash_algo=algo)
            a = make_seq(prompt, 0)
            bm.allocate(a, 2048)
            a.num_computed_tokens = 2048
            t0 = timeit.default_timer()
            bm.register_full_blocks(a)
            t1 = timeit.default_timer()
            hits = bm.find_cached_prefix(make_seq(prompt, 1))
            t2 = timeit.default_timer()
            assert len(hits) == 127
            return t1 - t0, t2 - t1
        runs = [once() for _ in range(repeats * 5)]
        reg, find = (statistics.median(r[i] for r in runs) for i in (0, 1))
        print(f"  {algo:8s} register {reg * 1e6:7.1f} us  find {find * 1e6:7.1f} us  "
              f"total {(reg + find) * 1e6:7.1f} us")


if __name__ == "__main__":
    bench()
