"""The static batcher (minillm/baselines/static_batcher.py): a real padded static server on the engine.

Checks that it returns the tokens the continuous engine returns (greedy), computes every pad
position of a batch's prompts (B x the longest prompt, in the rows' prefill step, never from the
prefix cache), keeps finished rows in the batch until the longest ends (every decode step of a
batch carries every row), admits the next batch only after, computes exactly B x the longest
output per batch, and applies each request's own stop rules.
"""
import pytest

from minillm.baselines import run_static
from minillm.baselines.static_batcher import PAD_PREFIX
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from tests.helpers.engine_utils import greedy, random_prompts, run_to_completion, tiny_model


def engine(model, eos=(), max_num_seqs=3) -> LLMEngine:
    return LLMEngine(model, None, list(eos), EngineConfig(
        block_size=4, num_kv_blocks=128, max_num_seqs=max_num_seqs, max_num_batched_tokens=128,
        attention_backend="torch"))


def static_engine(model, eos=()) -> LLMEngine:
    return engine(model, eos, max_num_seqs=16)  # a batch of 3 plus its pad sequences (3 pad tokens each)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=5)


LENGTHS = [2, 9, 4, 7, 3, 3, 12]
BATCH = 3


def workload(lengths=LENGTHS, ignore_eos=True):
    prompts = random_prompts(len(lengths), 97, 3, 12, seed=6)
    out = []
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        sp = greedy(n)
        sp.ignore_eos = ignore_eos
        out.append((f"r{i}", p, sp))
    return out


def batches(items):
    return [items[i:i + BATCH] for i in range(0, len(items), BATCH)]


def continuous(model, reqs, eos=()):
    e = engine(model, eos)
    for rid, p, sp in reqs:
        e.add_request(rid, p, sp)
    return run_to_completion(e)


def test_same_tokens_as_continuous_and_finished_rows_are_kept(model):
    reqs = workload()
    e = static_engine(model)
    run = run_static(e, reqs, batch_size=BATCH)
    assert run.outputs == continuous(model, reqs)
    lens = batches(LENGTHS)
    assert run.computed_tokens == sum(len(b) * max(b) for b in lens)
    assert run.useful_tokens == sum(LENGTHS)
    # every decode step of a batch carries all its rows until its longest request is done: max(b) steps each
    assert run.steps == sum(max(b) for b in lens)
    decode_rows = [r.num_decode_tokens for r in e.trace if not r.num_prefill_tokens]
    assert decode_rows == [n for b in lens for n in [len(b)] * (max(b) - 1)]
    assert e.block_manager.num_free_blocks == e.block_manager.num_blocks


def test_prefill_computes_every_padded_position(model):
    reqs = workload()
    e = static_engine(model)
    run = run_static(e, reqs, batch_size=BATCH)
    prompts = batches([len(p) for _, p, _ in reqs])
    assert min(prompts[0]) < max(prompts[0])  # the workload needs padding
    assert run.pad_tokens == sum(len(b) * max(b) - sum(b) for b in prompts)
    # each batch's first step prefills B x its longest prompt: the rows' tokens and the pad positions
    prefills = [r.num_prefill_tokens for r in e.trace if r.num_prefill_tokens]
    assert prefills == [len(b) * max(b) for b in prompts]
    # the work: every padded prompt position, then every row's decodes until its batch's longest ends
    outs = batches(LENGTHS)
    assert run.computed_positions == sum(len(b) * max(b) for b in prompts) + sum(len(b) * (max(b) - 1) for b in outs)
    pad_steps = {r.step for r in e.trace for s in r.scheduled if s.request_id.startswith(PAD_PREFIX)}
    assert pad_steps <= {r.step for r in e.trace if r.num_prefill_tokens}  # in the rows' step, not later


def test_pad_positions_are_never_served_from_the_prefix_cache(model):
    reqs = workload()
    e = static_engine(model)
    run_static(e, reqs, batch_size=BATCH)
    start = len(e.trace)
    again = run_static(e, [(f"again-{rid}", p, sp) for rid, p, sp in reqs], batch_size=BATCH)
    pads = [s for r in e.trace[start:] for s in r.scheduled if s.request_id.startswith(PAD_PREFIX)]
    assert sum(s.num_new_tokens for s in pads) == again.pad_tokens > 0
    assert all(s.num_prefix_hit_tokens == 0 for s in pads)
    assert sum(r.prefix_hit_tokens for r in e.trace[start:]) > 0  # the rows' own prompts did hit


def test_next_batch_waits_for_the_whole_batch(model):
    e = static_engine(model)
    run_static(e, workload(), batch_size=BATCH)
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
    e = static_engine(model, eos=[eos])
    run = run_static(e, reqs, batch_size=BATCH)
    assert run.outputs == continuous(model, reqs, eos=[eos])
    assert run.outputs["r1"][-1] == eos and len(run.outputs["r1"]) <= 4
    assert run.computed_tokens > run.useful_tokens


def test_refuses_what_it_cannot_do_statically(model):
    reqs = workload()
    with pytest.raises(ValueError, match="seats"):
        run_static(engine(model, max_num_seqs=BATCH), reqs, batch_size=BATCH)  # no seat for the padding
