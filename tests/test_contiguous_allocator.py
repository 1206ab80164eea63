"""The contiguous KV allocator (the pre-paging baseline) and the real engine running on it.

The allocator is checked against a brute-force slot map: every slot's owner kept in a
list, gaps found by scanning it. Random reserve/free sequences must agree exactly on
placement (first fit), coalescing and both kinds of fragmentation. The engine on
contiguous reservations must produce the paged engine's greedy tokens, hold each
sequence's whole reservation from admission on, and admit fewer sequences at once.
"""
import random

import pytest

from minillm.engine.config import EngineConfig
from minillm.engine.contiguous_allocator import ContiguousAllocator
from minillm.engine.contiguous_block_manager import ContiguousBlockManager
from minillm.engine.llm_engine import LLMEngine
from tests.helpers.engine_utils import greedy, random_prompts, run_to_completion, tiny_model


class SlotMap:
    """The reference: one owner (or None) per slot; first fit by scanning."""

    def __init__(self, capacity: int) -> None:
        self.owner: list[object | None] = [None] * capacity

    def gaps(self) -> list[tuple[int, int]]:
        out, start = [], None
        for i, o in enumerate(self.owner + ["end"]):
            if o is None and start is None:
                start = i
            elif o is not None and start is not None:
                out.append((start, i - start))
                start = None
        return out

    def reserve(self, owner: object, size: int) -> int | None:
        for start, n in self.gaps():
            if n >= size:
                self.owner[start : start + size] = [owner] * size
                return start
        return None

    def free(self, owner: object) -> None:
        self.owner = [None if o == owner else o for o in self.owner]


@pytest.mark.parametrize("seed", range(20))
def test_matches_brute_force_slot_map(seed):
    rng = random.Random(seed)
    cap = rng.randint(8, 200)
    alloc, ref = ContiguousAllocator(cap), SlotMap(cap)
    used: dict[int, int] = {}
    for step in range(300):
        if used and rng.random() < 0.45:
            owner = rng.choice(sorted(used))
            alloc.free(owner)
            ref.free(owner)
            del used[owner]
        else:
            size = rng.randint(1, max(1, cap // 3))
            ext = alloc.reserve(step, size)
            start = ref.reserve(step, size)
            assert (ext.start if ext else None) == start, "not first fit"
            if ext is not None:
                used[step] = rng.randint(0, size)
        # reservations never overlap and lie inside the region
        taken = sorted((e.start, e.end) for e in alloc.reservations.values())
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(taken, taken[1:]))
        assert all(0 <= s and e <= cap for s, e in taken)
        # the free list is exactly the reference's gaps: sorted, coalesced (no two adjacent)
        assert [(g.start, g.size) for g in alloc.gaps] == ref.gaps()
        nxt = rng.randint(1, cap)
        rep = alloc.report(used, nxt)
        assert rep.used == sum(used.values())
        assert rep.reserved == sum(o is not None for o in ref.owner)
        assert rep.internal == rep.reserved - rep.used
        assert rep.free == sum(o is None for o in ref.owner)
        assert rep.external == sum(n for _, n in ref.gaps() if n < nxt)
        assert rep.largest_gap == max((n for _, n in ref.gaps()), default=0)
    for owner in list(used):
        alloc.free(owner)
    assert [(g.start, g.size) for g in alloc.gaps] == [(0, cap)], "frees did not coalesce back to one region"


def test_frees_coalesce_on_both_sides():
    a = ContiguousAllocator(30)
    for name in "abc":
        a.reserve(name, 10)
    assert a.gaps == []
    a.free("a")
    a.free("c")
    assert [(g.start, g.size) for g in a.gaps] == [(0, 10), (20, 10)]
    a.free("b")  # merges with the gap before and the gap after
    assert [(g.start, g.size) for g in a.gaps] == [(0, 30)]


def test_external_fragmentation_refuses_a_reservation_that_total_free_space_would_hold():
    a = ContiguousAllocator(40)
    for name in "abcd":
        a.reserve(name, 10)
    a.free("a")
    a.free("c")
    assert a.free_slots == 20 and a.reserve("e", 15) is None
    rep = a.report({"b": 3, "d": 10}, next_size=15)
    assert (rep.external, rep.internal, rep.largest_gap) == (20, 7, 10)


def test_reports_reject_impossible_usage():
    a = ContiguousAllocator(10)
    a.reserve("x", 4)
    with pytest.raises(ValueError):
        a.report({"x": 5})


# ----- the real engine on contiguous reservations ------------------------------------------------
def engine(model, allocator: str, num_blocks: int = 48, max_model_len: int = 64) -> LLMEngine:
    return LLMEngine(model, None, [], EngineConfig(
        block_size=4, num_kv_blocks=num_blocks, enable_prefix_caching=False, max_num_seqs=16,
        max_num_batched_tokens=64, max_model_len=max_model_len, attention_backend="torch", kv_allocator=allocator))


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


def submit(e: LLMEngine, prompts, lengths) -> None:
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        e.add_request(f"r{i}", p, greedy(n))


@pytest.mark.parametrize("allocator", ["contiguous", "contiguous-request"])
def test_greedy_tokens_match_the_paged_engine(model, allocator):
    rng = random.Random(1)
    prompts = random_prompts(10, 97, 3, 20, seed=2)
    lengths = [rng.randint(1, 30) for _ in prompts]
    outs = {}
    for kind in ("paged", allocator):
        e = engine(model, kind)
        submit(e, prompts, lengths)
        outs[kind] = run_to_completion(e)
        assert e.block_manager.num_free_blocks == e.block_manager.num_blocks
    assert outs["paged"] == outs[allocator]
    assert all(len(outs[allocator][f"r{i}"]) == n for i, n in enumerate(lengths))


def test_reservations_are_contiguous_held_whole_and_limit_concurrency(model):
    prompts = random_prompts(8, 97, 3, 10, seed=4)
    lengths = [6] * 8
    peak = {}
    for kind in ("paged", "contiguous", "contiguous-request"):
        e = engine(model, kind)  # 48 blocks of 4 = 192 slots; max_model_len 64 -> 3 reservations
        submit(e, prompts, lengths)
        while e.has_unfinished_requests():
            e.step()
            for s in e.live_sequences():
                t = s.block_table
                if kind != "paged" and t:
                    assert t == list(range(t[0], t[0] + len(t))), "a reservation must be one run of blocks"
                    assert len(t) * 4 == e.block_manager.reservation_slots(s)
            if kind != "paged":
                rep = e.block_manager.fragmentation()
                assert rep.used == sum(s.num_computed_tokens for s in e.live_sequences() if s.block_table)
        peak[kind] = max(len(r.block_tables) for r in e.trace)
    assert peak["contiguous"] == 3
    assert peak["paged"] == 8 and peak["contiguous-request"] == 8  # 16-slot reservations: all 8 fit


def test_contiguous_request_reserves_prompt_plus_max_tokens(model):
    e = engine(model, "contiguous-request")
    e.add_request("a", list(range(1, 11)), greedy(7))  # 17 tokens -> 5 blocks of 4
    e.step()
    seq = e.live_sequences()[0]
    assert isinstance(e.block_manager, ContiguousBlockManager)
    assert len(seq.block_table) == 5 and e.block_manager.fragmentation().reserved == 20


def test_external_fragmentation_in_the_engine(model):
    # 12 blocks of 4 = 48 slots. a and c reserve 16 slots each, b 8 between them; b finishes first,
    # leaving two 8-slot gaps: 16 slots free, yet d's 16-slot reservation fits in neither.
    e = engine(model, "contiguous-request", num_blocks=12, max_model_len=48)
    e.add_request("a", list(range(1, 10)), greedy(7))  # 9 + 7 = 16 slots
    e.add_request("b", list(range(1, 5)), greedy(4))   # 4 + 4 = 8 slots
    e.add_request("c", list(range(1, 10)), greedy(7))
    e.add_request("d", list(range(1, 10)), greedy(7))
    bm = e.block_manager
    seen_external = []
    while e.has_unfinished_requests():
        e.step()
        rep = bm.fragmentation(16)
        if rep.free == 16 and "d" not in {s.request_id for s in e.live_sequences() if s.block_table}:
            seen_external.append(rep.external)
    assert bm.refusals.capacity >= 1, "d first waits for space"
    assert bm.refusals.fragmentation >= 1, "then for a gap: enough free slots, none contiguous"
    assert seen_external and all(x == 16 for x in seen_external)


def test_a_pool_smaller_than_one_reservation_is_refused_at_construction(model):
    # bad configuration gets a clear error up front, not a crash inside the first step
    with pytest.raises(ValueError, match="reserves max_model_len=256 tokens .16 blocks.* 8 blocks"):
        LLMEngine(model, None, [], EngineConfig(block_size=16, num_kv_blocks=8, max_model_len=256,
                                                kv_allocator="contiguous"))
    # prompt + max_tokens reservations are checked per request, as the paged engine checks them
    e = LLMEngine(model, None, [], EngineConfig(block_size=16, num_kv_blocks=8, max_model_len=256,
                                                kv_allocator="contiguous-request"))
    from minillm.engine.request import RequestError

    with pytest.raises(RequestError, match="can never fit"):
        e.add_request("big", [1, 2, 3], greedy(200))
    e.add_request("ok", [1, 2, 3], greedy(5))
    assert len(run_to_completion(e)["ok"]) == 5
