"""Exact equivalences on a tiny random model: paged+batched+chunked+cached == dense, token for token."""
import pytest

from tests.helpers.engine_utils import dense_greedy, greedy, make_engine, random_prompts, run_to_completion, tiny_model

PROMPTS = random_prompts(12, 97, 1, 70, seed=1)
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def reference(model):
    return [dense_greedy(model, p, MAX_TOKENS) for p in PROMPTS]


def run(model, prompts, **kw):
    eng = make_engine(model, **kw)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, greedy(MAX_TOKENS))
    out = run_to_completion(eng)
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks, "blocks leaked"
    return [out[str(i)] for i in range(len(prompts))], eng


@pytest.mark.parametrize(
    "kw",
    [
        dict(num_blocks=512, max_num_batched_tokens=1024),  # everything in one prefill step
        dict(num_blocks=512, max_num_batched_tokens=16),  # chunked prefill mixed with decodes
        dict(num_blocks=30, max_num_batched_tokens=24),  # pool too small: preemption by recompute
        dict(num_blocks=512, max_num_batched_tokens=1024, prefix_caching=False),
        dict(num_blocks=512, max_num_batched_tokens=128, chunked=False),
        dict(num_blocks=512, max_num_batched_tokens=64, block_size=16),
        dict(num_blocks=512, max_num_batched_tokens=64, max_num_seqs=3),
    ],
)
def test_paged_batched_equals_dense(model, reference, kw):
    got, eng = run(model, PROMPTS, **kw)
    assert got == reference
    if kw["num_blocks"] == 30:
        assert any(t.preemptions for t in eng.trace), "the small pool was meant to force preemption"
    if kw["max_num_batched_tokens"] == 16:
        assert any(t.num_prefill_tokens and t.num_decode_tokens for t in eng.trace), "no mixed step happened"


def test_prefix_cache_hits_and_identical_outputs(model):
    shared = PROMPTS[0] * 2  # 2 x len(PROMPTS[0]) tokens of common prefix
    prompts = [shared + p for p in PROMPTS[1:6]]
    cached, eng_c = run(model, prompts, num_blocks=512, max_num_batched_tokens=256, max_num_seqs=1)
    uncached, eng_u = run(model, prompts, num_blocks=512, max_num_batched_tokens=256, max_num_seqs=1,
                          prefix_caching=False)
    assert cached == uncached
    hits = sum(t.prefix_hit_tokens for t in eng_c.trace)
    assert hits >= 4 * (len(shared) // 4) * 4, f"expected the shared prefix to hit for requests 2..5, got {hits}"
    assert sum(t.prefix_hit_tokens for t in eng_u.trace) == 0
    assert any(t.blocks_shared for t in eng_c.trace)


def test_n_greater_than_one_shares_prompt_blocks(model):
    from minillm.sampling_params import SamplingParams

    eng = make_engine(model, num_blocks=128, block_size=4, prefix_caching=False)
    prompt = PROMPTS[3][:30]
    eng.add_request("r", prompt, SamplingParams(n=3, temperature=0.0, max_tokens=8, ignore_eos=True))
    outs = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                outs[o.request_id] = o
        eng.block_manager.check_invariants(eng.live_sequences())
    toks = [c.token_ids for c in outs["r"].outputs]
    assert toks[0] == toks[1] == toks[2] == dense_greedy(model, prompt, 8)
    shared = [b for t in eng.trace for b in t.blocks_shared]
    assert len(shared) == 2 * (len(prompt) // 4), "each sibling takes the parent's full prompt blocks"
    assert any(max(t.block_ref_counts) == 3 for t in eng.trace)


@pytest.mark.parametrize("num_blocks", [30, 512])  # 30: preemption frees and re-allocates blocks mid-run
def test_the_trace_block_snapshot_is_always_the_pool_as_it_is(model, num_blocks):
    """The trace reuses its per-block snapshot while BlockManager.version stands still: after every step
    (prefix hits, preemption, an abort) it must equal the pool read afresh."""
    eng = make_engine(model, num_blocks=num_blocks, max_num_batched_tokens=24)
    shared = PROMPTS[0] * 2
    for i, p in enumerate(PROMPTS[:6]):
        eng.add_request(str(i), shared + p if i % 2 else p, greedy(MAX_TOKENS))
    bm, reused, step = eng.block_manager, 0, 0
    while eng.has_unfinished_requests():
        eng.step()
        step += 1
        rec = eng.trace[-1]
        assert rec.block_ref_counts == tuple(b.ref_count for b in bm.blocks)
        assert rec.block_cached == bm.cached_flags() and rec.free_queue == bm.free_order()
        if len(eng.trace) > 1 and rec.block_ref_counts is eng.trace[-2].block_ref_counts:
            reused += 1
        if step == 5:  # between steps: the next record must see the blocks it freed
            eng.abort_request("1")
    assert reused, "no step reused the snapshot: the memo never applied"
    assert any(t.prefix_hit_tokens for t in eng.trace)
    if num_blocks == 30:
        assert any(t.preemptions for t in eng.trace)
