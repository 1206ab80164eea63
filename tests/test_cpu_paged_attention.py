"""The C++ paged decode attention (minillm/cpu/kernels/paged_attention.cpp) against the PyTorch gather path.

The gather path (torch_backend.paged_decode) is the reference: both must give the same
attention output for any block table, GQA group, sliding window and dtype, and a whole
engine must give the same greedy tokens with the kernel on and off.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minillm.attention.torch_backend import decode_gather_slots, decode_head_rows, paged_decode
from minillm.cpu.kernels import paged_attention_cpu as cpu_paged
from tests.helpers.engine_utils import greedy, make_engine, run_to_completion, tiny_model

if not cpu_paged.available():
    pytest.skip("the C++ paged attention could not be built here", allow_module_level=True)


def reference(q, k_cache, v_cache, tables, lens, scale, window):
    slots, mask = decode_gather_slots(tables, lens, int(lens.max()), k_cache.shape[1], masked=True, window=window)
    rows = decode_head_rows(slots, q.shape[0], k_cache.shape[2])
    return paged_decode(q.float(), k_cache.float(), v_cache.float(), rows, mask, scale)


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 6), kv_heads=st.sampled_from([1, 2, 3]), group=st.sampled_from([1, 3, 4]),
       head_dim=st.sampled_from([16, 20, 64, 72, 128]), block_size=st.sampled_from([1, 4, 16]),
       window=st.sampled_from([None, 1, 5, 40]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       table_dtype=st.sampled_from([torch.int32, torch.int64]), seed=st.integers(0, 2**16))
def test_kernel_equals_the_gather_path(batch, kv_heads, group, head_dim, block_size, window, dtype, table_dtype,
                                       seed):
    """head_dim 16/64/72/128 take the 8-keys-at-a-time AVX2 path (its tail keys the plain loop), 20 the
    plain loop only; the V sum's 64-column register strips: none (16), one (64), one and a chunk of 8
    (72), two (128), over tiles of 32 keys (up to 96 here); int64 tables are cast, int32 ones read as given."""
    g = torch.Generator().manual_seed(seed)
    num_blocks, per_seq = 48, 6
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    tables = torch.stack([torch.randperm(num_blocks, generator=g)[:per_seq] for _ in range(batch)]).to(table_dtype)
    lens = torch.randint(1, per_seq * block_size + 1, (batch,), generator=g)
    q = torch.randn(batch, kv_heads * group, head_dim, generator=g).to(dtype)
    got = cpu_paged.paged_decode(q, k_cache, v_cache, tables, lens, 0.125, window)
    want = reference(q, k_cache, v_cache, tables, lens, 0.125, window)
    assert got.dtype == dtype and got.shape == q.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: the output is rounded to 8 mantissa bits
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("batch, kv_heads, lens, window", [
    (1, 3, [500], None),  # batch-1 decode of the default model's shape: 3 tasks on 2 threads, keys split
    (1, 3, [700], 200),  # the window's keys are what is split
    (1, 1, [300], None),
    (3, 1, [130, 600, 40], None),  # one sequence too short to split: its second part reads nothing
    (2, 3, [150, 600], None),  # 6 tasks share evenly: no split
    (1, 3, [90], None),  # few keys: one thread
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_sequences_split_between_threads_equal_the_gather_path(batch, kv_heads, lens, window, dtype):
    """Where a call's (sequence, kv head) tasks do not share evenly among the threads, each task's keys
    are split between them and the partial softmaxes merged (paged_attention.cpp): the result is the
    gather path's, and a tree row's path keys (tail slots) land in the right part. Two threads here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(len(lens) * 100 + lens[0])
        block_size, head_dim, group = 16, 64, 3
        per_seq = max(lens) // block_size + 1
        num_blocks = batch * per_seq + 4
        k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
        v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
        tables = torch.randperm(num_blocks, generator=g)[: batch * per_seq].view(batch, per_seq).int()
        lens_t = torch.tensor(lens)
        q = torch.randn(batch, kv_heads * group, head_dim, generator=g).to(dtype)
        got = cpu_paged.paged_decode(q, k_cache, v_cache, tables, lens_t, 0.125, window)
        want = reference(q, k_cache, v_cache, tables, lens_t, 0.125, window)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
        # a tree row: its last 3 keys read from other slots (of the last block's spare rows)
        spare = (int(tables[0, -1]) * block_size + torch.arange(block_size - 3, block_size)).view(1, 3)
        tails = torch.full((batch, 3), -1, dtype=torch.int64)
        tails[0] = spare
        with_path = cpu_paged.paged_decode(q, k_cache, v_cache, tables, lens_t, 0.125, window, tail_slots=tails)
        torch.set_num_threads(1)  # one thread never splits: the same keys, read as one range
        one = cpu_paged.paged_decode(q, k_cache, v_cache, tables, lens_t, 0.125, window, tail_slots=tails)
        torch.testing.assert_close(with_path.float(), one.float(), atol=tol, rtol=tol)
        assert not torch.allclose(with_path[0].float(), got[0].float(), atol=1e-3)  # the path keys were read
    finally:
        torch.set_num_threads(threads)


def test_only_the_table_s_blocks_are_read():
    """Blocks outside a sequence's table (other sequences' rows, free blocks) filled with NaN change nothing."""
    k_cache = torch.full((10, 4, 1, 8), float("nan"))
    v_cache = torch.full((10, 4, 1, 8), float("nan"))
    tables = torch.tensor([[7, 2, 0]], dtype=torch.int32)
    for b in (7, 2):
        k_cache[b], v_cache[b] = torch.randn(4, 1, 8), torch.randn(4, 1, 8)
    k_cache[0, :1], v_cache[0, :1] = torch.randn(1, 1, 8), torch.randn(1, 1, 8)  # position 8: the last one
    q = torch.randn(1, 2, 8)
    out = cpu_paged.paged_decode(q, k_cache, v_cache, tables, torch.tensor([9]), 0.3)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, reference(q, k_cache.nan_to_num(), v_cache.nan_to_num(), tables,
                                              torch.tensor([9]), 0.3, None))


def test_bad_shapes_get_a_clear_error():
    q = torch.randn(2, 4, 8)
    cache = torch.randn(4, 4, 2, 8)
    with pytest.raises(RuntimeError, match="a length past its block table"):
        cpu_paged.paged_decode(q, cache, cache, torch.zeros(2, 1, dtype=torch.int32), torch.tensor([3, 5]), 1.0)
    with pytest.raises(RuntimeError, match="share a dtype"):
        cpu_paged.paged_decode(q.double(), cache, cache, torch.zeros(2, 2, dtype=torch.int32), torch.tensor([3, 5]), 1.0)


def test_the_engine_gives_the_same_tokens_with_the_kernel_off(monkeypatch):
    """A whole engine (mixed prefill + decode steps, blocks freed and reused) with and without the kernel."""
    model = tiny_model(heads=6, kv_heads=2, head_dim=16)
    calls = []
    kernel = cpu_paged.paged_decode

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return kernel(*args, **kwargs)

    def run() -> dict:
        engine = make_engine(model, num_blocks=40, block_size=4, max_num_seqs=5, max_num_batched_tokens=24)
        for i in range(7):
            engine.add_request(str(i), [5 + i + j % 7 for j in range(3 + 4 * i)], greedy(10 + i))
        return run_to_completion(engine)

    monkeypatch.setattr(cpu_paged, "paged_decode", counted)
    with_kernel = run()
    assert calls and max(calls) > 1  # decode batches went through the kernel
    monkeypatch.setattr(cpu_paged, "_ready", False)
    calls.clear()
    assert run() == with_kernel
    assert not calls


def random_step(query_lens, seq_lens, bs, kvh, dtype, seed, group=3, d=16, blocks=64):
    """Block tables over a shuffled pool, random caches, and a step's q/k/v for these chunks."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(blocks, generator=g).tolist()
    tables, used = [], 0
    for n in seq_lens:
        tables.append(perm[used : used + -(-n // bs)])
        used += len(tables[-1])
    k_cache = torch.randn(blocks, bs, kvh, d, generator=g).to(dtype)
    v_cache = torch.randn(blocks, bs, kvh, d, generator=g).to(dtype)
    t = sum(query_lens)
    q = torch.randn(t, kvh * group, d, generator=g).to(dtype)
    k, v = torch.randn(t, kvh, d, generator=g).to(dtype), torch.randn(t, kvh, d, generator=g).to(dtype)
    return tables, k_cache, v_cache, q, k, v


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_chunks_as_kernel_rows_equal_the_chunk_path(window, dtype):
    """A step of 2 decode rows, two verify chunks (5 and 3 rows over cached keys), a 20-row prefill chunk
    and a fresh prompt: the kernel serves the decode rows and both verify chunks in one call (query i of a
    chunk as a decode row of its own length); the result equals the gather + SDPA chunk path."""
    from minillm.attention.metadata import AttentionMetadata
    from minillm.cpu.attention import CpuAttentionBackend

    bs, kvh = 4, 2
    query_lens, seq_lens = [1, 1, 5, 3, 20, 6], [9, 14, 17, 8, 30, 6]
    tables, k_cache, v_cache, q, k, v = random_step(query_lens, seq_lens, bs, kvh, dtype, seed=7)
    backend = CpuAttentionBackend()
    outs = []
    for as_rows in (True, False):
        meta = AttentionMetadata.build(query_lens, seq_lens, tables, bs)
        backend.prepare(meta, bs, kvh, quantized=False)
        if as_rows:
            assert (meta.backend_state.seqs, meta.backend_state.rows) == (4, 10)  # stops at the prefill chunk
        else:
            meta.backend_state = None
        outs.append(backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.25, window=window))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(outs[0].float(), outs[1].float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("window", [None, 3, 12])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_chunks_as_kernel_rows_equal_the_masked_chunk_path(window, dtype):
    """A step of a decode row, a draft tree (root + 5 nodes, two of depth 2 and one of depth 3), a chain
    verify chunk and a prefill chunk: the kernel serves the decode row, the tree and the chain in one call
    (each node a decode row whose last keys are its root-to-node path, read from the tree's scratch
    slots); the result equals the gather + masked SDPA chunk path, window counted from real positions."""
    from minillm.attention.metadata import AttentionMetadata
    from minillm.cpu.attention import CpuAttentionBackend

    bs, kvh = 4, 2
    parents = [-1, -1, 0, 0, 2]  # node 4 sits at depth 3 behind nodes 2 and 0
    query_lens, seq_lens = [1, 6, 3, 20], [9, 19, 8, 30]
    trees = [None, parents, None, None]
    tables, k_cache, v_cache, q, k, v = random_step(query_lens, seq_lens, bs, kvh, dtype, seed=11)
    backend = CpuAttentionBackend()
    outs = []
    for as_rows in (True, False):
        meta = AttentionMetadata.build(query_lens, seq_lens, tables, bs, tree_parents=trees)
        backend.prepare(meta, bs, kvh, quantized=False)
        if as_rows:
            assert (meta.backend_state.seqs, meta.backend_state.rows) == (3, 10)  # the tree joins; stops at the prefill chunk
            # node 4 (row 1 + 1 + 4 = 6): 13 cached keys, then the root, nodes 0, 2 and itself
            assert int(meta.backend_state.lens[6]) == 13 + 4
            assert meta.backend_state.tails[6].tolist()[-4:] == meta.slot_mapping[1:7][[0, 1, 3, 5]].tolist()
        else:
            meta.backend_state = None
        outs.append(backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.25, window=window))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(outs[0].float(), outs[1].float(), atol=tol, rtol=tol)


def test_bad_tail_slots_get_a_clear_error():
    q, k_cache = torch.randn(1, 2, 16), torch.randn(4, 4, 1, 16)
    tables, lens = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([3])
    with pytest.raises(RuntimeError, match="past the pool"):
        cpu_paged.paged_decode(q, k_cache, k_cache, tables, lens, 0.25, None, torch.tensor([[-1, 16]]))
    with pytest.raises(RuntimeError, match="more tail slots than keys"):
        cpu_paged.paged_decode(q, k_cache, k_cache, tables, lens, 0.25, None, torch.tensor([[1, 2, 3, 4]]))


def test_the_op_a_compiled_graph_calls_has_no_optional_tail():
    """Inductor's C++ wrapper passes a custom op only the arguments the graph gave it; an optional last
    argument (the tree rows' tail_slots) was then read past the end of the dispatcher's array and
    compiled decode crashed now and then. The tree rows have an op of their own."""
    args = torch.ops.minillm_attn.paged_decode.default._schema.arguments
    assert [a.name for a in args] == ["q", "k_cache", "v_cache", "block_tables", "seq_lens", "scale", "window"]
    assert [a.name for a in torch.ops.minillm_attn.paged_decode_paths.default._schema.arguments][-1] == "tail_slots"
