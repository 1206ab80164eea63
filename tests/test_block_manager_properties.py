"""Stateful property tests: the scheduler and block manager never leak or double-free a block.

Hypothesis drives random add / step / abort / finish sequences through the real
Scheduler and BlockManager (the model is replaced by "append a random token"),
checking after every action that ref counts equal the number of block tables
naming each block, and at the end that the pool is whole again.
"""
import random

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minillm.config import SchedulerConfig
from minillm.engine.block_manager import BlockManager
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence
from minillm.sampling_params import SamplingParams


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(8, 40), block_size=st.sampled_from([1, 2, 4, 16]),
        budget=st.integers(1, 64), max_seqs=st.integers(1, 6), caching=st.booleans(), chunked=st.booleans(),
    )
    def setup(self, num_blocks, block_size, budget, max_seqs, caching, chunked):
        self.bm = BlockManager(num_blocks, block_size, caching)
        budget = budget if chunked else max(budget, num_blocks * block_size)
        self.sched = Scheduler(SchedulerConfig(max_seqs, budget, chunked), self.bm)
        self.live: list[Sequence] = []
        self.next_id = 0
        self.rng = random.Random(0)
        self.capacity = num_blocks * block_size

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
        parent = self._new_seq(tokens)
        seqs = [parent] + [self._new_seq(tokens, parent, i) for i in range(1, n)]
        for s in seqs:
            self.sched.add(s)
        self.live.extend(seqs)

    @rule()
    def step(self):
        out = self.sched.schedule()
        budget = self.sched.config.max_num_batched_tokens
        assert sum(c.num_new_tokens for c in out.chunks) <= budget
        assert len(out.chunks) <= self.sched.config.max_num_seqs
        for c in out.chunks:
            seq = c.seq
            assert len(seq.block_table) * self.bm.block_size >= c.num_computed_before + c.num_new_tokens
            seq.num_computed_tokens += c.num_new_tokens
            self.bm.register_full_blocks(seq)
            if c.completes:
                if seq.num_output_tokens == 0 and seq.index == 0:
                    self.sched.release_children(seq)
                seq.token_ids.append(self.rng.randrange(4))
                # finish when the sequence would outgrow the pool or at random
                if seq.num_tokens >= self.capacity or self.rng.random() < 0.2:
                    self.sched.finish(seq)
                    self.live.remove(seq)

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
