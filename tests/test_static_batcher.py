"""The static batcher (minillm/baselines/static_batcher.py): a real static server on the engine.

Checks that it keeps finished rows in the batch until the longest ends (every decode step of a
batch carries every row), admits the next batch only after, computes exactly B x the longest
output per batch, applies each request's own stop rules, and returns the tokens the continuous
engine returns (greedy).
"""
import pytest

from minillm.baselines import run_static
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from tests.helpers.engine_utils import greedy, random_prompts, run_to_completion, tiny_model


def engine(model, eos=(), max_num_seqs=3) -> LLMEngine:
    return LLMEngine(model, None, list(eos), EngineConfig(
        block_size=4, num_kv_blocks=128, max_num_seqs=max_num_seqs, max_num_batched_tokens=128,
        attention_backend="torch"))


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=5)


LENGTHS = [2, 9, 4, 7, 3, 3, 12]


def workload(lengths=LENGTHS, ignore_eos=True):
    prompts = random_prompts(len(lengths), 97, 3, 12, seed=6)
    out = []
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        sp = greedy(n)
        sp.ignore_eos = ignore_eos
        out.append((f"r{i}", p, sp))
    return out


def continuous(model, reqs, eos=()):
    e = engine(model, eos)
    for rid, p, sp in reqs:
        e.add_request(rid, p, sp)
    return run_to_completion(e)


def test_same_tokens_as_continuous_and_finished_rows_are_kept(model):
    reqs = workload()
    e = engine(model)
    run = run_static(e, reqs, batch_size=3)
    assert run.outputs == continuous(model, reqs)
    batches = [LENGTHS[i:i + 3] for i in range(0, len(LENGTHS), 3)]
    assert run.computed_tokens == sum(len(b) * max(b) for b in batches)
    assert run.useful_tokens == sum(LENGTHS)
    # every step of a batch carries all its rows until its longest request is done: max(b) steps each
    assert run.steps == sum(max(b) for b in batches)
    per_step = [len(r.scheduled) for r in e.trace]
    assert per_step == [n for b in batches for n in [len(b)] * max(b)]
    assert e.block_manager.num_free_blocks == e.block_manager.num_blocks


def test_next_batch_waits_for_the_whole_batch(model):
    e = engine(model)
    run_static(e, workload(), batch_size=3)
    first_seen, last_seen = {}, {}
    for r in e.trace:
        for rid in {s.request_id for s in r.scheduled}:
            first_seen.setdefault(rid, r.step)
            last_seen[rid] = r.step
    assert max(last_seen[f"r{i}"] for i in range(3)) < min(first_seen[f"r{i}"] for i in range(3, 6))


def test_own_eos_stops_the_output_but_not_the_row(model):
    reqs = workload(ignore_eos=True)
    free = continuous(model, reqs)
    eos = free["r1"][3]  # a token r1 emits mid-way: an EOS for the run below
    reqs = workload(ignore_eos=False)
    e = engine(model, eos=[eos])
    run = run_static(e, reqs, batch_size=3)
    assert run.outputs == continuous(model, reqs, eos=[eos])
    assert run.outputs["r1"][-1] == eos and len(run.outputs["r1"]) <= 4
    assert run.computed_tokens > run.useful_tokens


def test_refuses_what_it_cannot_do_statically(model):
    reqs = workload()
    with pytest.raises(ValueError):
        run_static(engine(model, max_num_seqs=2), reqs, batch_size=3)
