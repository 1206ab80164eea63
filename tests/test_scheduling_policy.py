"""Scheduling policies (engine/policy.py): priority order, preemption victims, the short lane and its bound.

The scheduler is driven directly with a BlockManager and no model (each chunk that catches
its sequence up "samples" a random token), as the block-manager property tests do. What
can fail here:

- priority: a request admitted while a higher-priority one (smaller (priority, arrival)) stays
  waiting -- admission is strict, so "never passed over when both fit" holds in the stronger
  form "never passed over"; a preemption that evicts a sequence while a lower-priority one keeps
  running;
- length-aware: a long request that waits at the head of its lane longer than the stated
  bound, N + (the longest max_tokens) - 1 steps with budget and blocks to spare; a short request
  that waits for a seat the lane reserves;
- every policy: greedy tokens that differ from a dense recompute (a policy changes the order,
  never the tokens), trace records without priority/lane, a bad value accepted.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from minillm.engine.block_manager import BlockManager
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine, RequestError
from minillm.engine.policy import LONG, SHORT, LengthAwarePolicy, priority_key
from minillm.engine.scheduler import ChosenTokens, Scheduler
from minillm.engine.sequence import Sequence
from minillm.engine.trace import dump_trace, load_trace
from minillm.sampling_params import SamplingParams
from tests.helpers.engine_utils import dense_greedy, greedy, random_prompts, run_to_completion, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class Driver:
    """A Scheduler over a real BlockManager; the "model" appends a random token."""

    def __init__(self, policy: str, num_blocks: int, block_size: int, max_num_seqs: int, budget: int,
                 caching: bool = False, **policy_knobs) -> None:
        self.bm = BlockManager(num_blocks, block_size, caching)
        cfg = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, num_kv_blocks=num_blocks,
                           block_size=block_size, enable_prefix_caching=caching, scheduling_policy=policy,
                           **policy_knobs)
        self.sched = Scheduler(cfg, self.bm, max_model_len=10**6)
        self.rng = random.Random(0)
        self.next_id = 0
        self.steps = 0
        self.admitted_at: dict[int, int] = {}  # seq_id -> step of its first admission

    def add(self, prompt_len: int, max_tokens: int, priority: int = 0) -> Sequence:
        sid = self.next_id
        self.next_id += 1
        tokens = [self.rng.randrange(4) for _ in range(prompt_len)]
        seq = Sequence(sid, f"r{sid}", 0, tokens, prompt_len, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                       float(self.steps), max_tokens=max_tokens, priority=priority)
        self.sched.add(seq)
        return seq

    def step(self):
        self.steps += 1
        batch = self.sched.schedule()
        for c in batch.chunks:
            self.admitted_at.setdefault(c.seq.seq_id, self.steps)
        chosen = [ChosenTokens([self.rng.randrange(4)], [None]) if c.completes else None for c in batch.chunks]
        self.sched.update(batch, chosen, 0.0, 0.0)
        self.bm.check_invariants(self.sched.running)
        return batch


# ----- priority ----------------------------------------------------------------------------

request = st.tuples(st.integers(1, 12), st.integers(1, 8), st.integers(-2, 2))  # prompt, max_tokens, priority


@settings(max_examples=40, deadline=None)
@given(arrivals=st.lists(st.lists(request, max_size=3), min_size=1, max_size=10),
       num_blocks=st.integers(11, 30), block_size=st.sampled_from([2, 4]), max_seqs=st.integers(1, 5),
       budget=st.integers(1, 40), caching=st.booleans())
def test_priority_never_passed_over_and_lowest_preempted(arrivals, num_blocks, block_size, max_seqs, budget, caching):
    d = Driver("priority", num_blocks, block_size, max_seqs, budget, caching)
    preemptions = 0
    for i in range(400):
        for prompt_len, max_tokens, priority in (arrivals[i] if i < len(arrivals) else ()):
            d.add(prompt_len, max_tokens, priority)
        before = {s.seq_id for s in d.sched.waiting}
        batch = d.step()
        admitted = [c.seq for c in batch.chunks if c.seq.seq_id in before]
        passed_over = [s for s in d.sched.waiting if s.seq_id in before]
        for a in admitted:
            for b in passed_over:
                assert priority_key(b) > priority_key(a), f"seq {a.seq_id} {priority_key(a)} admitted before {priority_key(b)}"
        for p in batch.preempted:  # the victim was the lowest-priority sequence running
            preemptions += 1
            assert all(priority_key(r) < priority_key(p.seq) for r in d.sched.running), (
                f"preempted {priority_key(p.seq)} while {[priority_key(r) for r in d.sched.running]} run")
        if i >= len(arrivals) and not d.sched.has_unfinished:
            break
    assert not d.sched.has_unfinished and d.bm.num_free_blocks == d.bm.num_blocks


def test_preemption_picks_the_lowest_priority():
    # three running sequences of priorities 0, 2, 1 fill a 6-block pool; the next decode needs a block
    for policy, victim in (("priority", "r1"), ("fcfs", "r2")):
        d = Driver(policy, num_blocks=6, block_size=2, max_num_seqs=3, budget=64)
        for priority in (0, 2, 1):
            d.add(prompt_len=4, max_tokens=8, priority=priority)
        d.step()  # three prefills of 2 blocks each: the pool is full
        batch = d.step()  # each decode needs a third block
        assert [p.seq.request_id for p in batch.preempted][:1] == [victim]


def test_priority_serves_the_queue_in_priority_order():
    d = Driver("priority", num_blocks=64, block_size=4, max_num_seqs=1, budget=64)
    for priority in (3, 1, 2, 1, 0):
        d.add(prompt_len=3, max_tokens=2, priority=priority)
    while d.sched.has_unfinished:
        d.step()
    order = sorted(d.admitted_at, key=d.admitted_at.get)
    assert order == [4, 1, 3, 2, 0]  # (priority, arrival): the two priority-1 requests in arrival order


# ----- length-aware ------------------------------------------------------------------------

SHORT_MAX = 10  # short_lane_max_tokens in these tests: prompt + max_tokens <= 10
short_req = st.tuples(st.integers(1, 3), st.integers(1, 4))  # at most 7 tokens: short
long_req = st.tuples(st.integers(1, 3), st.integers(10, 14))  # at least 11: long


@settings(max_examples=40, deadline=None)
@given(arrivals=st.lists(st.lists(st.one_of(short_req, long_req), max_size=3), min_size=1, max_size=30),
       max_seqs=st.integers(1, 4), share=st.sampled_from([0.25, 0.5]), wait=st.integers(0, 6))
def test_length_aware_starvation_bound(arrivals, max_seqs, share, wait):
    """The stated bound: with budget and blocks to spare (here 64 tokens a step, 256 tokens of pool,
    so no chunking and no preemption), a long request is admitted at most N + R - 1 steps after it
    reaches the head of the long lane, N = long_lane_max_wait_steps, R = the longest max_tokens
    (a sequence holds its seat for max_tokens steps). Hypothesis reaches N + R - 1: the bound is tight."""
    d = Driver("length-aware", 64, 4, max_seqs, 64, short_lane_max_tokens=SHORT_MAX, short_lane_share=share,
               long_lane_max_wait_steps=wait)
    policy = d.sched.policy
    seqs, head_since = [], {}
    for i in range(1000):
        for prompt_len, max_tokens in (arrivals[i] if i < len(arrivals) else ()):
            seqs.append(d.add(prompt_len, max_tokens))
        head = next((s for s in d.sched.waiting if policy.lane(s) == LONG), None)
        if head is not None:
            head_since.setdefault(head.seq_id, d.steps + 1)
        batch = d.step()
        assert not batch.preempted and sum(policy.lane(s) == LONG for s in d.sched.running) <= policy.long_lane_seats
        if i >= len(arrivals) and not d.sched.has_unfinished:
            break
    assert not d.sched.has_unfinished
    longest = max((s.max_tokens for s in seqs), default=0)
    for s in seqs:
        if policy.lane(s) == LONG:  # (one admitted in the same step as the head before it never was head)
            waited = d.admitted_at[s.seq_id] - head_since.get(s.seq_id, d.admitted_at[s.seq_id])
            assert waited <= wait + longest - 1, f"long seq {s.seq_id} waited {waited} steps at the head (bound {wait} + {longest} - 1)"


def test_a_stream_of_short_requests_does_not_starve_a_long_one():
    """Two short requests arrive every step: without the bound they would hold both seats forever."""
    def run(wait: int) -> tuple[int | None, int]:
        d = Driver("length-aware", 64, 4, 2, 64, short_lane_max_tokens=SHORT_MAX, short_lane_share=0.5,
                   long_lane_max_wait_steps=wait)
        d.add(2, 2)
        d.add(2, 2)
        long_ = d.add(2, 12)
        for _ in range(40):
            d.add(2, 2)
            d.add(2, 2)
            d.step()
        return d.admitted_at.get(long_.seq_id), len(d.admitted_at)

    admitted, _ = run(wait=5)
    assert admitted is not None and admitted <= 1 + 5 + 2  # head from step 1; N = 5; the shorts run 2 steps
    starved, served = run(wait=10**6)
    assert starved is None and served > 20  # the lane alone would starve it: the bound is what admits it


def test_the_short_lane_keeps_a_seat_long_generations_cannot_take():
    waits = {}
    for policy in ("fcfs", "length-aware"):
        d = Driver(policy, 128, 4, 4, 256, short_lane_max_tokens=SHORT_MAX, short_lane_share=0.25)
        for _ in range(6):
            d.add(4, 40)  # long generations first: they would take every seat
        d.step()
        d.step()
        chat = d.add(3, 4)
        while chat.seq_id not in d.admitted_at:
            d.step()
        waits[policy] = d.admitted_at[chat.seq_id] - 3  # it arrived after step 2
        if policy == "length-aware":
            assert d.sched.policy.reserved_seats == 1 and d.sched.policy.long_lane_seats == 3
    assert waits["length-aware"] == 0  # admitted the step it arrived
    assert waits["fcfs"] >= 40 - 2  # behind four long generations holding all four seats


def test_lanes_and_seat_shares():
    p = LengthAwarePolicy(8, short_lane_max_tokens=100, short_lane_share=0.25, long_lane_max_wait_steps=3)
    assert (p.reserved_seats, p.long_lane_seats) == (2, 6)
    one = LengthAwarePolicy(1, 100, 0.5, 3)
    assert (one.reserved_seats, one.long_lane_seats) == (0, 1)  # one seat: the long lane keeps it
    s = Sequence(0, "a", 0, [1] * 60, 60, SamplingParams(max_tokens=40), 0.0, max_tokens=40)
    l_ = Sequence(1, "b", 0, [1] * 60, 60, SamplingParams(max_tokens=41), 0.0, max_tokens=41)
    assert (p.lane(s), p.lane(l_)) == (SHORT, LONG)  # prompt + max_tokens against 100


# ----- every policy on a model -------------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    return tiny_model()


PROMPTS = random_prompts(10, 97, 1, 40, seed=3)
MAX_TOKENS = [4 + 3 * (i % 4) for i in range(10)]
PRIORITIES = [(i * 7) % 3 for i in range(10)]


def test_greedy_tokens_identical_under_every_policy(model):
    reference = {str(i): dense_greedy(model, p, n) for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS))}
    orders = {}
    for policy in ("fcfs", "priority", "length-aware"):
        eng = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=24, max_num_seqs=3,
                                                      max_num_batched_tokens=24, scheduling_policy=policy,
                                                      short_lane_max_tokens=30))
        for i, (p, n, pr) in enumerate(zip(PROMPTS, MAX_TOKENS, PRIORITIES)):
            eng.add_request(str(i), p, greedy(n), priority=pr)
        assert run_to_completion(eng) == reference, policy
        assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
        orders[policy] = list(dict.fromkeys(s.request_id for t in eng.trace for s in t.scheduled))
        if policy == "priority":
            assert any(t.preemptions for t in eng.trace), "the small pool was meant to force preemption"
    assert len({tuple(o) for o in orders.values()}) == 3  # three different admission orders, the same tokens


def test_trace_records_priority_and_lane(model, tmp_path):
    eng = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=64, max_num_seqs=2,
                                                  scheduling_policy="length-aware", short_lane_max_tokens=20))
    eng.add_request("chat", [1, 2, 3], greedy(4), priority=-1)
    eng.add_request("long", [4, 5], greedy(30), priority=2)
    eng.add_request("chat2", [6], greedy(2))
    run_to_completion(eng)
    first = eng.trace[0]
    assert [(a.request_id, a.priority, a.lane) for a in first.arrivals] == [
        ("chat", -1, SHORT), ("long", 2, LONG), ("chat2", 0, SHORT)]
    # two seats, one reserved for short requests: the short ones go first, the long one waits
    assert {(s.request_id, s.priority, s.lane) for s in first.scheduled} == {("chat", -1, SHORT), ("chat2", 0, SHORT)}
    assert first.scheduling_policy == "length-aware"
    assert [(q.request_id, q.lane, q.running) for q in first.queue] == [
        ("long", LONG, False), ("chat", SHORT, True), ("chat2", SHORT, True)]
    assert ("long", 2, LONG) in {(s.request_id, s.priority, s.lane) for t in eng.trace for s in t.scheduled}
    assert eng.trace[-1].queue == ()
    path = tmp_path / "trace.jsonl"
    dump_trace(eng.trace, str(path))
    assert load_trace(str(path)) == eng.trace


def test_bad_policy_values_are_clear_errors(model):
    with pytest.raises(ValueError, match="scheduling_policy 'lifo'.*fcfs"):
        EngineConfig(scheduling_policy="lifo")
    with pytest.raises(ValueError, match="short_lane_share"):
        EngineConfig(short_lane_share=1.0)
    with pytest.raises(ValueError, match="long_lane_max_wait_steps"):
        EngineConfig(long_lane_max_wait_steps=-1)
    with pytest.raises(ValueError, match="short_lane_max_tokens"):
        EngineConfig(short_lane_max_tokens=0)
    eng = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=16, scheduling_policy="priority"))
    for bad in ("1", 1.5, True, None):
        with pytest.raises(RequestError, match="priority must be an integer"):
            eng.add_request("r", [1, 2], greedy(2), priority=bad)
    assert not eng.has_unfinished_requests()


def test_llm_generate_takes_a_priority_per_prompt(tmp_path):
    from minillm import LLM
    from tests.helpers.tiny_models import make_tiny_hf_model

    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    llm = LLM(str(folder), scheduling_policy="priority", max_num_seqs=1, num_kv_blocks=64, block_size=4)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    outs = llm.generate(prompts, greedy(3), use_tqdm=False, priority=[2, 0, 1])
    assert [o.prompt_token_ids for o in outs] == prompts  # input order back
    served = list(dict.fromkeys(s.request_id for t in llm.trace for s in t.scheduled))
    assert served == [outs[1].request_id, outs[2].request_id, outs[0].request_id]  # one seat: by priority
    assert [a.priority for t in llm.trace for a in t.arrivals] == [2, 0, 1]
    llm.generate(prompts[:1], greedy(1), use_tqdm=False, priority=7)  # one int: every prompt's
    assert [a for t in llm.trace for a in t.arrivals][-1].priority == 7
    with pytest.raises(ValueError, match="3 prompts but 2 priorities"):
        llm.generate(prompts, greedy(1), use_tqdm=False, priority=[0, 1])
    with pytest.raises(RequestError, match="priority must be an integer"):
        llm.generate(prompts, greedy(1), use_tqdm=False, priority=[0, "high", 1])
    assert not llm.engine.has_unfinished_requests()  # checked before anything was queued


def test_server_passes_priority_and_refuses_a_bad_one():
    import httpx

    from minillm.server import create_app
    from minillm.server.background import ServerThread
    from tests.helpers.tiny_tokenizer import EOS, make_tiny_tokenizer
    from tests.test_server_helpers import MODEL_NAME, printable_tiny_model

    engine = LLMEngine(printable_tiny_model(), make_tiny_tokenizer(), [EOS],
                       EngineConfig(block_size=4, num_kv_blocks=128, scheduling_policy="priority"))
    with ServerThread(create_app(engine, model_name=MODEL_NAME)) as srv, httpx.Client(base_url=srv.url) as http:
        ok = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, "priority": 3})
        chat = http.post("/v1/chat/completions", json={"model": MODEL_NAME, "max_tokens": 2, "priority": -1,
                                                       "messages": [{"role": "user", "content": "hi"}]})
        bad = [http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "hi", "priority": p})
               for p in ("high", 1.5, "2")]
    assert ok.status_code == 200 and chat.status_code == 200, (ok.text, chat.text)
    assert [a.priority for t in engine.trace for a in t.arrivals] == [3, -1]
    for r in bad:
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
