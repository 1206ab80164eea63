"""The radix prefix cache (prefix_cache="radix"): no leak, no double free, exact longest-prefix hits.

1. RadixMachine drives RadixBlockManager the way the scheduler does (admit with a hit,
   prefill chunks, decodes with lookahead slots trimmed back, n > 1 sharing, finish, abort,
   preempt and re-admit, pressure that forces eviction) and checks after every step:
   - every block is in exactly one place (free queue, tree, a sequence's private blocks), ref
     counts equal the tables naming each block, locks equal the live sequences' paths
     (RadixBlockManager.check_invariants), free + used == pool;
   - a match returns exactly the longest cached block-aligned prefix, compared with a
     brute-force reference kept here: a dict {block-aligned token prefix: block holding its
     last block}, filled from the registered sequences and emptied by the evicted blocks;
   - the reference stays prefix-closed (no cached block ever stranded behind an evicted parent)
     and no block a live sequence uses is ever evicted.
2. The scheduler property machine of test_block_manager_properties (K/V fingerprints per slot)
   runs with the radix manager.
3. Greedy outputs are identical with radix, hash and no prefix caching on a tiny random model,
   with shared prefixes and a pool small enough to preempt and evict.
"""
import random

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine, make_block_manager
from minillm.engine.radix_cache import RadixBlockManager
from minillm.engine.radix_tree import RadixTree
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence
from minillm.sampling_params import SamplingParams
from tests.helpers.engine_utils import dense_greedy, greedy, random_prompts, run_to_completion, tiny_model
from tests.test_block_manager_properties import SchedulerMachine


class RadixMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(6, 30), block_size=st.sampled_from([1, 2, 4]))
    def setup(self, num_blocks, block_size):
        self.bm = RadixBlockManager(num_blocks, block_size)
        self.bs = block_size
        self.running: list[Sequence] = []
        self.waiting: list[Sequence] = []  # preempted: their tokens come back through the cache
        self.prompts: list[list[int]] = []
        self.ref: dict[tuple[int, ...], int] = {}  # block-aligned prefix -> block caching its last block
        self.next_id = 0
        self.rng = random.Random(0)

    # ----- the reference --------------------------------------------------------------------
    def _reference_match(self, tokens):
        bs, hits = self.bs, []
        for j in range((len(tokens) - 1) // bs):
            bid = self.ref.get(tuple(tokens[: (j + 1) * bs]))
            if bid is None:
                break
            hits.append(bid)
        return hits

    def _registered(self, seq):
        """After register_full_blocks: the reference caches every full computed block not yet cached."""
        bs = self.bs
        for i in range(min(seq.num_computed_tokens, seq.num_tokens) // bs):
            self.ref.setdefault(tuple(seq.token_ids[: (i + 1) * bs]), seq.block_table[i])

    def _in_use(self, *extra):
        return {b for s in [*self.running, *extra] for b in s.block_table}

    def _allocate(self, seq, num_tokens):
        """allocate, then check its evictions against the blocks in use before it (and update the reference)."""
        in_use = self._in_use(seq)
        self.bm.allocate(seq, num_tokens)
        gone = set(self.bm.take_events().evicted)
        assert not gone & in_use, f"evicted blocks {sorted(gone & in_use)} were in use"
        self.ref = {k: b for k, b in self.ref.items() if b not in gone}
        assert gone.isdisjoint(self.ref.values())

    # ----- the scheduler's moves ----------------------------------------------------------
    def _admit(self, seq):
        cached = self.bm.find_cached_prefix(seq)
        assert cached == self._reference_match(seq.token_ids), "not the longest cached block-aligned prefix"
        remaining = seq.num_tokens - len(cached) * self.bs
        if not self.bm.can_allocate(seq, remaining, cached):
            return False
        if cached:
            self.bm.take_cached_prefix(seq, cached)
        self._allocate(seq, remaining)  # can_allocate said yes: this must not raise
        self.running.append(seq)
        return True

    @rule(data=st.data(), length=st.integers(1, 24), again=st.booleans())
    def admit(self, data, length, again):
        """A new prompt over a 3-token alphabet, or an earlier prompt extended (a chat's next turn)."""
        head = data.draw(st.sampled_from(self.prompts)) if again and self.prompts else []
        tokens = (head + [data.draw(st.integers(0, 2)) for _ in range(length)])[: self.bm.num_blocks * self.bs // 2]
        seq = Sequence(self.next_id, f"r{self.next_id}", 0, tokens, len(tokens), SamplingParams(), 0.0)
        self.next_id += 1
        self.prompts.append(tokens)
        self._admit(seq)

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data(), chunk=st.integers(1, 9))
    def compute(self, data, chunk):
        """A prefill chunk (or the last token) computed: full blocks enter the tree."""
        seq = data.draw(st.sampled_from(self.running))
        seq.num_computed_tokens = min(seq.num_tokens, seq.num_computed_tokens + chunk)
        self.bm.register_full_blocks(seq)
        self._registered(seq)

    @precondition(lambda self: any(s.num_computed_tokens == s.num_tokens for s in self.running))
    @rule(data=st.data(), lookahead=st.integers(0, 3), accepted=st.integers(0, 3))
    def decode(self, data, lookahead, accepted):
        """Sample a token, then compute it with `lookahead` draft slots of which `accepted` are kept."""
        seq = data.draw(st.sampled_from([s for s in self.running if s.num_computed_tokens == s.num_tokens]))
        seq.token_ids.append(data.draw(st.integers(0, 2)))
        if not self.bm.can_allocate(seq, 1 + lookahead):
            return self._preempt(seq)
        self._allocate(seq, 1 + lookahead)
        seq.num_computed_tokens += 1
        self.bm.register_full_blocks(seq)
        accepted = min(accepted, lookahead)
        seq.token_ids.extend(data.draw(st.integers(0, 2)) for _ in range(accepted))
        seq.num_computed_tokens += accepted
        self.bm.trim(seq)
        self.bm.register_full_blocks(seq)
        self._registered(seq)
        assert len(seq.block_table) == self.bm.blocks_needed(seq.num_computed_tokens)

    @precondition(lambda self: any(s.num_computed_tokens >= self.bs for s in self.running))
    @rule(data=st.data())
    def share(self, data):
        """n > 1: a sibling takes the parent's full computed blocks."""
        parent = data.draw(st.sampled_from([s for s in self.running if s.num_computed_tokens >= self.bs]))
        nblocks = min(parent.num_computed_tokens // self.bs, (parent.num_tokens - 1) // self.bs)
        child = Sequence(self.next_id, f"r{self.next_id}", 1, list(parent.token_ids), parent.num_tokens,
                         SamplingParams(), 0.0)
        self.next_id += 1
        self.bm.share_prefix(child, parent, nblocks)
        if self.bm.can_allocate(child, child.num_tokens - child.num_computed_tokens):
            self._allocate(child, child.num_tokens - child.num_computed_tokens)
            self.running.append(child)
        else:
            self.bm.free(child)

    def _preempt(self, seq):
        self.running.remove(seq)
        self.bm.free(seq)
        self.waiting.append(seq)

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def preempt(self, data):
        self._preempt(data.draw(st.sampled_from(self.running)))

    @precondition(lambda self: bool(self.waiting))
    @rule()
    def readmit(self):
        seq = self.waiting[0]
        if self._admit(seq):
            self.waiting.pop(0)

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def finish_or_abort(self, data):
        seq = data.draw(st.sampled_from(self.running))
        self.running.remove(seq)
        self.bm.free(seq)

    # ----- checked after every step -------------------------------------------------------------
    @invariant()
    def no_leak_no_double_free(self):
        if not hasattr(self, "bm"):
            return
        bm = self.bm
        bm.check_invariants(self.running)
        private = {b for s in self.running for b in s.block_table} - set(bm.tree.node_of_block)
        assert len(bm.free_queue) + len(bm.tree.node_of_block) + len(private) == bm.num_blocks, "a block leaked"
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
        # the tree caches exactly what the reference says, and the reference is prefix-closed
        assert set(self.ref.values()) == set(bm.tree.node_of_block), "tree and reference disagree"
        for key in self.ref:
            assert len(key) == self.bs or key[: -self.bs] in self.ref, f"cached block stranded: {key}"
        # what allocate can get: the free queue, then the blocks of unlocked nodes (locked ones stay)
        unlocked = {b for n in bm.tree.nodes() if n.lock_ref == 0 for b in n.block_ids}
        assert sorted(bm.free_order()) == sorted(set(bm.free_queue) | unlocked)
        assert len(bm.free_order()) == bm.num_free_blocks

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for s in list(self.running):
            self.bm.free(s)
        self.bm.check_invariants([])
        assert self.bm.num_free_blocks == self.bm.num_blocks, "pool not whole after every sequence ended"


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


class RadixSchedulerMachine(SchedulerMachine):
    """The scheduler machine (K/V fingerprints through the real Scheduler) on the radix manager."""

    @initialize(
        num_blocks=st.integers(8, 40), block_size=st.sampled_from([1, 2, 4, 16]), budget=st.integers(1, 64),
        max_seqs=st.integers(1, 6), chunked=st.booleans(), lookahead=st.sampled_from([0, 1, 3]),
        via_update=st.booleans(),
    )
    def setup(self, num_blocks, block_size, budget, max_seqs, chunked, lookahead, via_update):
        SchedulerMachine.setup(self, num_blocks, block_size, budget, max_seqs, True, chunked, "sha256", lookahead,
                               via_update)
        self.bm = RadixBlockManager(num_blocks, block_size)
        self.sched = Scheduler(self.sched.config.replace(prefix_cache="radix"), self.bm, max_model_len=self.capacity)

    @invariant()
    def cached_hashes_are_chain_hashes(self):
        pass  # no hashes here; check_invariants checks each sequence's tree path spells its tokens


TestRadixScheduler = RadixSchedulerMachine.TestCase
TestRadixScheduler.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


def test_tree_splits_at_block_boundaries_and_evicts_leaves_lru_first():
    tree = RadixTree(2)
    root = tree.root
    tree.lock(root)
    a, _ = tree.extend(root, (1, 2), 10)
    a, _ = tree.extend(a, (3, 4), 11)  # grows the same node: one node, two blocks
    assert a.tokens == (1, 2, 3, 4) and a.block_ids == [10, 11] and len(root.children) == 1
    m = tree.match([1, 2, 3, 5])
    assert m.block_ids == [10] and m.num_in_node == 1
    upper = tree.node_at(m)  # split after the first block; `a` keeps the rest
    assert upper.block_ids == [10] and a.block_ids == [11] and a.parent is upper and upper.lock_ref == 1
    tree.lock(upper)  # a second sequence, whose path ends at `upper`, completes a different block
    b, added = tree.extend(upper, (5, 6), 12)
    assert added and b.parent is upper and set(upper.children) == {(3, 4), (5, 6)}
    assert (root.lock_ref, upper.lock_ref, a.lock_ref, b.lock_ref) == (2, 2, 1, 1) and tree.evictable_blocks == 0
    tree.touch(a)  # a was used last: b's leaf goes first, then a, then their parent
    tree.unlock(a)
    assert tree.eviction_order() == [11] and tree.evictable_blocks == 1
    tree.unlock(b)
    tree.check()
    assert tree.eviction_order() == [12, 11, 10]
    assert tree.evict(2) == [12, 11] and tree.match([1, 2, 3, 4, 0]).block_ids == [10]
    tree.check()


def test_bad_prefix_cache_name_is_refused():
    with pytest.raises(ValueError, match="prefix_cache"):
        EngineConfig(prefix_cache="trie")
    with pytest.raises(ValueError, match="prefix_cache"):
        make_block_manager(4, 4, prefix_cache="lru")
    assert not isinstance(make_block_manager(4, 4, enable_prefix_caching=False, prefix_cache="radix"),
                          RadixBlockManager)  # no caching: nothing to build a tree of


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.usefixtures("one_thread")  # tests/conftest.py
def test_greedy_outputs_identical_with_radix_hash_and_no_prefix_caching(model):
    base = random_prompts(8, 97, 3, 30, seed=4)
    system = base[0] * 2
    prompts = [system + p for p in base[1:]] + [system + base[1] + base[2]] + base[:2]
    runs, outs = {}, {}
    for name, kw in (("none", dict(enable_prefix_caching=False)), ("hash", {}), ("radix", dict(prefix_cache="radix"))):
        for blocks in (24, 512) if name == "radix" else (24,):  # 24 blocks of 4: preemption and eviction
            e = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=blocks, max_num_seqs=4,
                                                        max_num_batched_tokens=48, attention_backend="torch", **kw))
            for i, p in enumerate(prompts):
                e.add_request(str(i), p, greedy(8))
            out = run_to_completion(e)  # check_invariants after every step
            assert e.block_manager.num_free_blocks == blocks, "blocks leaked"
            runs[name, blocks], outs[name, blocks] = e, [out[str(i)] for i in range(len(prompts))]
    assert all(o == outs["none", 24] for o in outs.values())
    assert outs["none", 24][0] == dense_greedy(model, prompts[0], 8)  # and the engine is right at all
    radix, hashed = runs["radix", 24], runs["hash", 24]
    assert isinstance(radix.block_manager, RadixBlockManager)
    assert sum(t.prefix_hit_tokens for t in radix.trace) > 0 and any(t.blocks_evicted for t in radix.trace)
    assert any(t.preemptions for t in radix.trace)
    assert any(t.prefix_tree for t in radix.trace) and not any(t.prefix_tree for t in hashed.trace)
    # with room for everything, every prompt after the first finds the system prompt's full blocks
    assert sum(t.prefix_hit_tokens for t in runs["radix", 512].trace) >= len(system) // 4 * 4 * (len(prompts) - 3)
