"""The tile recorder (minillm.kernels.trace_tiles) reports what the real kernels did.

The recorder reads the kernels' local variables under the Triton interpreter,
so these tests check the recorded state against independent PyTorch
computations: the running max and sum after the last tile give the
reference's logsumexp, each program's recorded block ids are its block-table
entries, every key is covered once, the masks match the causal rule, and the
split-K combine sees exactly the splits' final state. They also check that
recording changes nothing: same outputs as the reference, the previous trace
function and the kernels' launchers restored.
"""
import math
import os
import sys

import numpy as np
import pytest
import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
    pytest.skip("the tile recorder needs the Triton interpreter (TRITON_INTERPRET=1)", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")

from minillm.kernels import paged_decode as pd  # noqa: E402
from minillm.kernels import prefill as pf  # noqa: E402
from minillm.kernels import trace_tiles as tt  # noqa: E402
from minillm.kernels.testing import make_paged_workload, max_err  # noqa: E402

LN2 = math.log(2)
LOG2E = 1 / LN2
SCALE = 0.3
PAGE, BN = 4, 16
# 6 query heads on 2 kv heads (groups of 3, like the default model's 9:3); head dim 24 pads to 32 lanes
H, KVH, D = 6, 2, 24


@pytest.fixture(scope="module")
def decode_case():
    # lengths: ragged (45), shorter than two tiles (23), exactly one tile (16), a single key (1)
    w = make_paged_workload([1, 1, 1, 1], [45, 23, 16, 1], H, KVH, D, PAGE, torch.float32, seed=2)
    return w, tt.trace_paged_decode(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, SCALE, block_n=BN)


@pytest.fixture(scope="module")
def prefill_case():
    # a fresh 40-token prompt (3 query tiles, the last ragged) and a 12-token chunk after an 18-token cached prefix
    w = make_paged_workload([40, 12], [40, 30], H, KVH, D, PAGE, torch.float32, seed=3)
    tr = tt.trace_prefill(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, SCALE,
                          block_m=16, block_n=BN)
    return w, tr


def kv_rows(w, seq, n):
    """K rows of the sequence's first n keys, gathered through its block table (plain PyTorch)."""
    pos = torch.arange(n)
    return w.k_cache[w.block_tables[seq].long()[pos // PAGE], pos % PAGE].double()  # [n, kvh, D]


# ---------------------------------------------------------------- decode
def test_decode_output_and_logsumexp_match_reference(decode_case):
    w, tr = decode_case
    ref = pd.paged_decode_attention_ref(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, SCALE)
    assert max_err(tr.out, ref) < 1e-5
    lse_ref = tt.decode_logsumexp_ref(w.q, w.k_cache, w.block_tables, w.seq_lens, SCALE)
    lse = tr.logsumexp()
    assert not lse.isnan().any()
    torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-6)
    # the same from each program's state after its last tile, by hand: ln2 * (m + log2 l)
    for p in tr.programs:
        got = LN2 * (p.steps[-1].m.astype(np.float64) + np.log2(p.steps[-1].l.astype(np.float64)))
        np.testing.assert_allclose(got, lse_ref[p.seq, list(p.heads)].numpy(), atol=1e-5)


def test_decode_programs_and_blocks(decode_case):
    w, tr = decode_case
    assert sorted(p.program_id for p in tr.programs) == [(b, h, 0) for b in range(4) for h in range(KVH)]
    for p in tr.programs:
        n = w.seq_lens_list[p.seq]
        table = w.block_tables_list[p.seq]
        assert p.heads == tuple(range(p.kv_head * 3, p.kv_head * 3 + 3))
        assert p.key_range == (0, n)
        assert len(p.steps) == -(-n // BN)
        assert p.blocks_read == table  # every page once, in logical order, nothing else
        keys = np.concatenate([st.key_pos[st.loaded] for st in p.steps])
        np.testing.assert_array_equal(keys, np.arange(n))  # each key loaded exactly once
        for st in p.steps:
            np.testing.assert_array_equal(st.block_ids[st.loaded], np.array(table)[st.key_pos[st.loaded] // PAGE])
            assert (st.block_ids[~st.loaded] == -1).all() and (st.key_pos[~st.loaded] >= n).all()
            np.testing.assert_array_equal(st.offsets, st.key_pos % PAGE)
    assert [st.order for st in tr.steps] == list(range(len(tr.steps)))
    assert tr.block_tables == w.block_tables_list


def test_decode_recorded_state_is_the_online_softmax(decode_case):
    w, tr = decode_case
    for p in tr.programs:
        n = w.seq_lens_list[p.seq]
        k = kv_rows(w, p.seq, n)[:, p.kv_head]  # [n, D]
        s_ref = (w.q[p.seq, list(p.heads)].double() @ k.T * SCALE * LOG2E).numpy()  # [group, n] log2 units
        m_prev = np.full(3, -np.inf)
        for st in p.steps:
            keys = st.key_pos[st.loaded]
            np.testing.assert_allclose(st.scores[:, st.loaded], s_ref[:, keys], atol=1e-5)
            assert np.isneginf(st.scores[:, ~st.loaded]).all()
            assert (st.m >= m_prev).all()  # the running max never decreases
            np.testing.assert_allclose(st.m, np.maximum(m_prev, s_ref[:, keys].max(1)), atol=1e-5)
            np.testing.assert_allclose(st.alpha, np.exp2(m_prev - st.m), atol=1e-6)
            seen = s_ref[:, : keys[-1] + 1]  # all keys up to this tile, rescaled to the current max
            np.testing.assert_allclose(st.l, np.exp2(seen - st.m[:, None]).sum(1), rtol=1e-5)
            m_prev = st.m


def test_split_k_ranges_and_combine():
    w = make_paged_workload([1, 1, 1], [70, 20, 5], H, KVH, D, PAGE, torch.float32, seed=4)
    tr = tt.trace_paged_decode(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, SCALE, block_n=BN, num_splits=3)
    ref = pd.paged_decode_attention_ref(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, SCALE)
    assert max_err(tr.out, ref) < 1e-5
    torch.testing.assert_close(tr.logsumexp(), tt.decode_logsumexp_ref(w.q, w.k_cache, w.block_tables, w.seq_lens,
                                                                       SCALE), atol=1e-5, rtol=1e-6)
    for b, n in enumerate(w.seq_lens_list):
        for kvh in range(KVH):
            progs = sorted((p for p in tr.programs if p.seq == b and p.kv_head == kvh), key=lambda p: p.split)
            assert [p.split for p in progs] == [0, 1, 2]
            # contiguous ranges of whole tiles that cover [0, n); short sequences leave splits empty
            ends = [p.key_range for p in progs if p.steps]
            assert ends[0][0] == 0 and ends[-1][1] == n
            assert all(a[1] == b_[0] for a, b_ in zip(ends, ends[1:]))
            assert all(lo % BN == 0 for lo, _ in ends)
            for p in progs:
                if not p.steps:
                    assert np.isneginf(p.m).all() and (p.l == 0).all() and p.blocks_read == []
            for h in progs[0].heads:
                c = next(c for c in tr.combine if c.seq == b and c.head == h)
                g = progs[0].heads.index(h)
                np.testing.assert_array_equal(c.m, [p.m[g] for p in progs])  # the combine reads the splits' state
                np.testing.assert_array_equal(c.l, [p.l[g] for p in progs])
                assert c.m_all == pytest.approx(float(np.max(c.m)))
                np.testing.assert_allclose(c.weights, np.exp2(c.m - c.m_all), atol=1e-7)
    assert any(not p.steps for p in tr.programs), "the 5-key sequence must leave a split empty"
    assert len(tr.combine) == 3 * H


# ---------------------------------------------------------------- prefill
def test_prefill_output_and_logsumexp_match_reference(prefill_case):
    w, tr = prefill_case
    ref = pf.prefill_attention_ref(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, SCALE)
    assert max_err(tr.out, ref) < 1e-5
    lse_ref = tt.prefill_logsumexp_ref(w.q, w.k_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, SCALE)
    lse = tr.logsumexp()
    assert not lse.isnan().any()
    torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-6)


def test_prefill_programs_tiles_and_blocks(prefill_case):
    w, tr = prefill_case
    # every (head, query tile) of both sequences, once; the kernel launches the last query tile first
    expect = {(h, s, t) for h in range(H) for s, q in enumerate(w.query_lens) for t in range(-(-q // 16))}
    assert {(p.heads[0], p.seq, p.q_tile) for p in tr.programs} == expect
    assert len(tr.programs) == len(expect)
    for p in tr.programs:
        n, q = w.seq_lens_list[p.seq], w.query_lens[p.seq]
        ctx = n - q
        n_q_tiles = -(-q // 16)
        assert p.program_id[1] == n_q_tiles - 1 - p.q_tile
        np.testing.assert_array_equal(p.row_positions, np.arange(ctx + 16 * p.q_tile, min(ctx + 16 * p.q_tile + 16, n)))
        last = int(p.row_positions[-1])
        loaded = min(-(-(last + 1) // BN) * BN, n)  # whole key tiles up to the last query, cut at seq_len
        assert p.keys_loaded == loaded
        assert p.blocks_read == w.block_tables_list[p.seq][: -(-loaded // PAGE)]
        first = int(p.row_positions[0])
        for st in p.steps:
            np.testing.assert_array_equal(st.block_ids[st.loaded],
                                          np.array(w.block_tables_list[p.seq])[st.key_pos[st.loaded] // PAGE])
            vis = (st.key_pos[None, :] <= p.row_positions[:, None]) & (st.key_pos[None, :] < n)
            np.testing.assert_array_equal(st.visible, vis)  # exactly the offset-causal mask
            if not st.causal:  # the unmasked phase: only keys every row of the tile may see
                assert st.key_pos[-1] <= first and st.visible.all()
        # the phases come in order: all full tiles, then the masked ones
        phases = [st.causal for st in p.steps]
        assert phases == sorted(phases) and phases[-1]


def test_prefill_counts_for_the_roofline(prefill_case):
    w, tr = prefill_case
    # useful FLOPs: 4 D per visible (query, key) pair per head
    pairs = sum(sum(ctx_q + 1 for ctx_q in range(n - q, n)) for n, q in zip(w.seq_lens_list, w.query_lens))
    assert tr.useful_flops(D) == H * pairs * 4 * D
    assert tr.kv_bytes_loaded(D, 4) == sum(2 * p.keys_loaded * D * 4 for p in tr.programs)


# ---------------------------------------------------------------- hygiene
def test_recording_leaves_nothing_behind(decode_case):
    w, _ = decode_case

    def outer(frame, event, arg):  # another tracer (a debugger, coverage) must survive
        return None

    launchers = (pd.kernel_launcher, pf.kernel_launcher)
    prev = sys.gettrace()
    sys.settrace(outer)
    try:
        tt.trace_paged_decode(w.q[:1], w.k_cache, w.v_cache, w.block_tables[:1], w.seq_lens[:1], SCALE)
        assert sys.gettrace() is outer
    finally:
        sys.settrace(prev)
    assert (pd.kernel_launcher, pf.kernel_launcher) == launchers
    # the untraced kernel still uses its own tile sizes and gives the same answer
    out = pd.paged_decode_attention(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, SCALE)
    ref = pd.paged_decode_attention_ref(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, SCALE)
    assert max_err(out, ref) < 1e-5


def test_tile_sizes_are_checked(decode_case):
    w, _ = decode_case
    for bad in (8, 24):
        with pytest.raises(ValueError):
            tt.trace_paged_decode(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, SCALE, block_n=bad)


def test_figures(decode_case, prefill_case):
    pytest.importorskip("plotly")
    _, dtr = decode_case
    _, ptr = prefill_case
    for tr, seq, head in ((dtr, 0, 4), (ptr, 1, 2)):
        view = tt.tile_view(tr, seq, head)
        assert len(view) == sum(len(p.steps) for p in view.programs) > 1
        fig = tt.tile_figure(view)
        assert len(fig.data) == 2 + 2 * tt._MAX_LINES
        assert "blocks" in fig.layout.title.text
        first = tt.tile_figure(view, 0)
        # step 0 shows only the first tile's scores; the last step shows all the view's scores
        assert np.isfinite(np.array(first.data[0].z, dtype=float)).sum() < np.isfinite(
            np.array(fig.data[0].z, dtype=float)).sum()
    with pytest.raises(ValueError):
        tt.tile_view(dtr, 9, 0)
