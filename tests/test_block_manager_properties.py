"""Stateful property tests: the scheduler and block manager never leak, double-free or mix up a block.

Hypothesis drives random add / step / abort sequences through the real Scheduler and
BlockManager. The model is replaced by "append a random token": a step writes, for every
slot it computes, a fingerprint of the whole token prefix up to that slot (what the K/V
there depends on), and may run speculatively (lookahead slots, a random number of draft
tokens accepted, the rest rolled back with `trim`). Either the test does the step's
bookkeeping itself, through the scheduler's and block manager's public methods, or it
hands the chosen tokens to `Scheduler.update`. After every action it checks that

- ref counts equal the number of block tables naming each block, free queue = ref count 0;
- every computed position of every live sequence reads K/V written for exactly its own prefix
  (a wrong prefix-cache hit, a block freed while still in use, a bad share would break this);
- every sequence holds exactly the blocks its computed tokens need (trim gave back the rest);
- every cached block's hash is the chain hash recomputed here, independently, from the tokens
  of each live sequence holding it, and hash_to_block maps that hash back to the block;

and at the end that the pool is whole again.
"""
import hashlib
import random
import struct

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minillm.engine.block_manager import HASH_ALGOS, ROOT_HASH, BlockManager
from minillm.engine.config import EngineConfig
from minillm.engine.scheduler import ChosenTokens, Scheduler
from minillm.engine.sequence import Sequence
from minillm.sampling_params import SamplingParams


def reference_chain_hash(algo, parent, tokens):
    """The prefix-cache hash, spelled out here so a change to block_manager's is caught."""
    if algo == "builtin":
        return hash((parent, tuple(tokens)))
    msg = (ROOT_HASH if parent is None else parent) + struct.pack("<q", len(tokens))
    msg += b"".join(t.to_bytes(8, "little", signed=True) for t in tokens)
    return hashlib.sha256(msg).digest()


def prefix_keys(tokens):
    """keys[p] fingerprints tokens[: p + 1], the prefix the K/V at position p is computed from."""
    keys, k = [], 0
    for t in tokens:
        k = hash((k, t))
        keys.append(k)
    return keys


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(8, 40), block_size=st.sampled_from([1, 2, 4, 16]),
        budget=st.integers(1, 64), max_seqs=st.integers(1, 6), caching=st.booleans(), chunked=st.booleans(),
        hash_algo=st.sampled_from(HASH_ALGOS), lookahead=st.sampled_from([0, 1, 3, 7]),
        via_update=st.booleans(),
    )
    def setup(self, num_blocks, block_size, budget, max_seqs, caching, chunked, hash_algo, lookahead, via_update):
        self.bm = BlockManager(num_blocks, block_size, caching, hash_algo)
        budget = budget if chunked else max(budget, num_blocks * block_size)
        self.capacity = num_blocks * block_size
        config = EngineConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, enable_chunked_prefill=chunked,
                              num_kv_blocks=num_blocks, block_size=block_size, enable_prefix_caching=caching,
                              prefix_caching_hash_algo=hash_algo)
        self.sched = Scheduler(config, self.bm, max_model_len=self.capacity)
        self.lookahead = lookahead  # draft slots on the steps that run speculatively
        self.via_update = via_update
        self.live: list[Sequence] = []
        self.next_id = 0
        self.prompts: list[list[int]] = []
        self.rng = random.Random(0)
        self.kv: dict[int, list] = {}  # block id -> per-slot prefix fingerprint last written there

    def _new_seq(self, tokens, parent=None, index=0):
        seq = Sequence(self.next_id, f"r{self.next_id}", index, list(tokens), len(tokens),
                       SamplingParams(max_tokens=4), 0.0)
        seq.wait_for_parent = parent
        self.next_id += 1
        return seq

    @rule(data=st.data(), n=st.integers(1, 3), shared=st.booleans())
    def add(self, data, n, shared):
        hi = max(1, self.capacity // 2)
        length = data.draw(st.integers(1, hi))
        # a small alphabet and a common head make prefix-cache hits frequent
        head = [1, 2, 3, 4, 5, 6, 7, 8] if shared else []
        tokens = (head + [data.draw(st.integers(0, 3)) for _ in range(length)])[: max(1, hi)]
        self._submit(tokens, n)

    def _submit(self, tokens, n):
        self.prompts.append(tokens)
        parent = self._new_seq(tokens)
        seqs = [parent] + [self._new_seq(tokens, parent, i) for i in range(1, n)]
        for s in seqs:
            self.sched.add(s)
        self.live.extend(seqs)

    @precondition(lambda self: bool(self.prompts))
    @rule(data=st.data(), extra=st.integers(0, 20))
    def add_again(self, data, extra):
        """An earlier prompt again, maybe longer: its full blocks should come from the prefix cache."""
        tokens = data.draw(st.sampled_from(self.prompts))
        tokens = (tokens + [data.draw(st.integers(0, 3)) for _ in range(extra)])[: max(1, self.capacity // 2)]
        self._submit(tokens, 1)

    def _write_kv(self, seq, start, tokens):
        """The model: the slots of positions start .. len(tokens)-1 get K/V for their prefix."""
        bs = self.bm.block_size
        keys = prefix_keys(tokens)
        for p in range(start, len(tokens)):
            slots = self.kv.setdefault(seq.block_table[p // bs], [None] * bs)
            slots[p % bs] = keys[p]

    @rule(speculative=st.booleans())
    def step(self, speculative):
        self.sched.num_lookahead_slots = self.lookahead if speculative else 0
        out = self.sched.schedule()
        budget = self.sched.config.max_num_batched_tokens
        bs = self.bm.block_size
        assert sum(c.num_new_tokens + c.num_lookahead for c in out.chunks) <= budget
        assert len(out.chunks) <= self.sched.config.max_num_seqs
        chosen = []
        for c in out.chunks:
            seq = c.seq
            end = c.num_computed_before + c.num_new_tokens
            assert c.num_lookahead == 0 or c.completes, "lookahead on a chunk that samples nothing"
            assert len(seq.block_table) * bs >= end + c.num_lookahead
            drafts = [self.rng.randrange(4) for _ in range(c.num_lookahead)]
            self._write_kv(seq, c.num_computed_before, seq.token_ids[:end] + drafts)
            if not c.completes:
                chosen.append(None)
                continue
            n_acc = self.rng.randint(0, len(drafts))  # the verifier keeps a prefix of the drafts ...
            chosen.append(ChosenTokens(drafts[:n_acc] + [self.rng.randrange(4)], [None] * (n_acc + 1), n_acc))
        if self.via_update:
            up = self.sched.update(out, chosen, 0.0, 0.0)
            for seq in up.finished:
                self.live.remove(seq)
            for seq in up.changed:  # ... and a sequence may also stop at random
                if not seq.is_finished and self.rng.random() < 0.2:
                    self.sched.finish(seq)
                    self.live.remove(seq)
            return
        for c, picked in zip(out.chunks, chosen):
            seq = c.seq
            seq.num_computed_tokens += c.num_new_tokens
            self.bm.register_full_blocks(seq)
            if picked is None:
                continue
            # speculative decoding: the accepted drafts' K/V is cache now, the rejected slots go back
            seq.num_computed_tokens += picked.num_accepted
            if c.num_lookahead:
                self.bm.trim(seq)
            assert len(seq.block_table) == self.bm.blocks_needed(seq.num_computed_tokens)
            if seq.num_output_tokens == 0 and seq.index == 0:
                self.sched.release_children(seq)
            for tok in picked.token_ids:
                seq.token_ids.append(tok)
                if seq.num_tokens >= self.capacity:
                    break
            # finish when the sequence would outgrow the pool or at random
            if seq.num_tokens >= self.capacity or self.rng.random() < 0.2:
                self.sched.finish(seq)
                self.live.remove(seq)
            else:
                self.bm.register_full_blocks(seq)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def abort(self, data):
        seq = data.draw(st.sampled_from(self.live))
        # aborting a request aborts all its sequences (siblings may still be parked on it)
        group = [s for s in self.live if s is seq or s.wait_for_parent is seq or seq.wait_for_parent is s]
        for s in group:
            self.sched.abort(s)
            self.live.remove(s)

    @invariant()
    def ref_counts_match_tables(self):
        if hasattr(self, "bm"):
            self.bm.check_invariants([s for s in self.live if s.block_table])

    @invariant()
    def every_sequence_reads_its_own_kv(self):
        if not hasattr(self, "bm"):
            return
        bs = self.bm.block_size
        for seq in self.live:
            assert len(seq.block_table) == self.bm.blocks_needed(seq.num_computed_tokens), (
                f"seq {seq.seq_id}: {len(seq.block_table)} blocks for {seq.num_computed_tokens} computed tokens")
            assert seq.num_computed_tokens <= seq.num_tokens
            keys = prefix_keys(seq.token_ids)
            for p in range(seq.num_computed_tokens):
                bid = seq.block_table[p // bs]
                assert self.kv[bid][p % bs] == keys[p], f"seq {seq.seq_id} position {p}: block {bid} holds other K/V"

    @invariant()
    def cached_hashes_are_chain_hashes(self):
        if not hasattr(self, "bm"):
            return
        bm, bs = self.bm, self.bm.block_size
        held_by = {}
        for seq in self.live:
            parent = None
            if bm.enable_prefix_caching:
                assert len(seq.block_hashes) == seq.num_computed_tokens // bs, f"seq {seq.seq_id}: unregistered blocks"
            for i, bid in enumerate(seq.block_table):
                tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
                block = bm.blocks[bid]
                if i >= len(seq.block_hashes):
                    assert block.block_hash is None, f"block {bid} cached past seq {seq.seq_id}'s registered blocks"
                    continue
                h = parent = reference_chain_hash(bm.hash_algo, parent, tokens)
                assert seq.block_hashes[i] == h, f"seq {seq.seq_id} block {i}: wrong chain hash"
                if block.block_hash is not None:
                    assert block.block_hash == h and block.token_ids == tokens, f"cached block {bid} mislabelled"
                    held_by[bid] = seq
        for block in bm.blocks:
            if block.block_hash is None:
                assert not block.token_ids
                continue
            assert bm.enable_prefix_caching
            assert bm.hash_to_block.get(block.block_hash) == block.block_id, f"hash_to_block lost {block.block_id}"
            assert len(block.token_ids) == bs
            assert block.ref_count == 0 or block.block_id in held_by
        assert len(bm.hash_to_block) == sum(b.block_hash is not None for b in bm.blocks)

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for s in list(self.live):
            self.sched.abort(s)
        self.bm.check_invariants([])
        assert self.bm.num_free_blocks == self.bm.num_blocks, "pool not whole after every request ended"
        assert not self.sched.running and not self.sched.waiting and not self.sched.parked


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
