"""Varlen causal prefill attention over the paged KV cache (FlashAttention-2 style forward).

Algorithm
---------
Tokens of all sequences are packed; sequence ``s`` owns query rows
``cu_seqlens_q[s] : cu_seqlens_q[s+1]`` and has ``seq_lens[s]`` keys after this
step (cached prefix + this chunk, all already stored in the cache). Query ``i``
of the chunk sits at absolute position ``ctx + i`` with ``ctx = seq_len -
query_len`` and sees keys ``0 .. ctx + i``. Because keys are always read
through the block table, a fresh prompt, a later chunk of a chunked prefill
and a prompt whose prefix came from the prefix cache are the same case.

One program owns one (query head, tile of ``BLOCK_M`` queries, sequence). Its
``[BLOCK_M, BLOCK_D]`` query tile stays in registers; it streams the keys in
tiles of ``BLOCK_N``: each K/V row is gathered from its page (block id from
the block table, ``pos // block_size``; offset ``pos % block_size``), scores
``S = Q K^T`` come from ``tl.dot`` with fp32 accumulation, and the online
softmax (base 2, ``qk_scale = scale * log2 e``) keeps per-row running max
``m``, sum ``l`` and unnormalised output ``acc``::

    m_new = max(m, rowmax(S));  P = 2^(S - m_new);  c = 2^(m - m_new)
    l = c * l + rowsum(P);      acc = c * acc + P V;  m = m_new

and finally ``out = acc / l``. Only Q, acc, m, l and the current K/V tile are
on chip; the ``[M, N]`` score matrix is never written to memory.

Masks: the key loop has two phases. Keys below the first query position of the
tile are visible to every row, so those whole tiles run with no causal mask
(the FA-2 trick that makes most tiles cheap). The remaining tiles, up to the
last query's position, apply ``key_pos <= q_pos`` and ``key_pos < seq_len``.
Padded query rows (past the chunk) and padded head-dim lanes are masked on
load/store.

Sliding window (``window``, Gemma 3's local layers): query ``p`` sees keys in
``(p - window, p]``. The key loop then starts at the tile holding the first
row's first key, ``first_pos - window + 1``, and gets a third phase in front:
tiles that hold keys the tile's last row still sees but its first rows no longer
do are masked with ``key_pos > q_pos - window`` as well; after them come the
unmasked tiles (visible to every row both ways) and the causal tiles as before.
All three ranges start and end on ``BLOCK_N`` boundaries, so no key is visited
twice. Without a window (``WINDOWED`` 0) that phase and the window test are not
compiled in at all and the loop is the one above. A row can see no key at all
in a masked tile (the window has not reached it yet); its running max stays
``-inf`` and is replaced by 0 in the exponentials, so no ``-inf - -inf`` NaN
appears and such tiles add exactly nothing.

Tree verification (``TREE`` 1, speculative decoding with a token tree, see
spec_decode/tree.py): a chunk's own keys are its draft nodes, and a node sees
only its ancestors. Each query row then reads its row of ``tree_mask`` (which of
its chunk's keys it sees) and its real position ``ctx + tree_depth`` (what a
window counts from). The unmasked phase stops at the chunk's first key, since
only the keys before the chunk are visible to every row; rows of ordinary chunks
in the same launch carry causal mask rows, so they compute what they would
without a tree.

GQA: query head ``h`` reads kv head ``h // GROUP``. Heads are the fastest grid
axis, so the programs of one group run together and share the K/V tiles
through L2.

Dtypes as in paged_decode: narrow tiles feed tensor cores on a GPU; under the
interpreter (and for fp32 caches) tiles are widened to fp32 after the load.
Quantized caches (``QUANT`` 1: int8, 2: fp8 e4m3 bits) as in paged_decode:
codes widened to q's dtype, the key scale folded into the scores and the
value scale into P, one multiply per key.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels._common import LOG2E, cast_out, compute_in_f32, interpreting, next_pow2
from minillm.kernels.kv_quant import codes_to_f32
from minillm.kernels.kv_store import quant_launch_args
from minillm.kernels.paged_decode import NO_WINDOW


@triton.jit
def attend_tiles(
    acc, l_i, m_i, q, q_pos, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_row, head_off, s_head_off, d_ok, seq_len, qk_scale,
    s_cb, s_co, s_sb, s_so, lo, hi, window, q_real, tm_rows, tk_ptr, ctx,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, F32: tl.constexpr, MASKED: tl.constexpr, QUANT: tl.constexpr,
    WINDOWED: tl.constexpr, TREE: tl.constexpr,
):
    """Online-softmax update of (acc, l, m) with the keys in [lo, hi).

    MASKED: the causal and past-the-end masks (WINDOWED: and the window's); else every key is visible."""
    n = tl.arange(0, BLOCK_N)
    for n0 in range(lo, hi, BLOCK_N):
        pos = n0 + n
        if MASKED:
            k_ok = pos < seq_len
            blk = tl.load(bt_row + pos // PAGE, mask=k_ok, other=0).to(tl.int64)
        else:
            blk = tl.load(bt_row + pos // PAGE).to(tl.int64)
        row = blk * s_cb + (pos % PAGE) * s_co
        ptr_off = row[:, None] + head_off[None, :]
        if MASKED:
            k = tl.load(kc_ptr + ptr_off, mask=k_ok[:, None] & d_ok[None, :], other=0)
        else:
            k = tl.load(kc_ptr + ptr_off, mask=d_ok[None, :], other=0)
        if QUANT != 0:
            srow = blk * s_sb + (pos % PAGE) * s_so + s_head_off
            if MASKED:
                k_sc = tl.load(ks_ptr + srow, mask=k_ok, other=0.0)
                v_sc = tl.load(vs_ptr + srow, mask=k_ok, other=0.0)
            else:
                k_sc = tl.load(ks_ptr + srow)
                v_sc = tl.load(vs_ptr + srow)
            k = codes_to_f32(k, QUANT).to(q.dtype)
        elif F32:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # [BLOCK_M, BLOCK_N]
        if QUANT != 0:
            s = s * k_sc[None, :]
        if MASKED:
            if TREE:  # keys before the chunk, then the chunk's keys its tree-mask row allows
                in_chunk = (pos >= ctx) & k_ok
                tm = tl.load(tm_rows[:, None] + (pos - ctx)[None, :], mask=in_chunk[None, :], other=1)
                vis = (tm != 0) & k_ok[None, :]
                k_real = tl.where(in_chunk, ctx + tl.load(tk_ptr + (pos - ctx), mask=in_chunk, other=0), pos)
            else:
                vis = (pos[None, :] <= q_pos[:, None]) & k_ok[None, :]
                k_real = pos
            if WINDOWED:
                vis = vis & (k_real[None, :] > q_real[:, None] - window)
            s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_exp = m_new
        if MASKED and WINDOWED:  # a row with no visible key yet keeps m = -inf; exponentiate against 0 instead
            m_exp = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_exp)
        p = tl.exp2(s - m_exp[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(vc_ptr + ptr_off, mask=k_ok[:, None] & d_ok[None, :], other=0)
        else:
            v = tl.load(vc_ptr + ptr_off, mask=d_ok[None, :], other=0)
        if QUANT != 0:
            v = codes_to_f32(v, QUANT).to(q.dtype)
            pv = p * v_sc[None, :]
        else:
            if F32:
                v = v.to(tl.float32)
            pv = p
        acc = acc * alpha[:, None] + tl.dot(pv.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def prefill_kernel(
    q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, cu_ptr, sl_ptr, o_ptr, tm_ptr, td_ptr,
    s_qt, s_qh, s_qd,
    s_cb, s_co, s_ch, s_cd,
    s_sb, s_so, s_sh,  # strides of the scale pools (QUANT only)
    s_btb,
    s_ot, s_oh, s_od,
    s_tm,  # row stride of the tree mask (TREE only)
    qk_scale, first_seq, window,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, F32: tl.constexpr, QUANT: tl.constexpr, WINDOWED: tl.constexpr, TREE: tl.constexpr,
):
    """One program per (head, query tile, sequence): BLOCK_M query rows of a chunk against the sequence's
    cached and new keys through attend_tiles. kernel_launcher picks its tiles; trace_tiles records it."""
    h = tl.program_id(0)
    seq = tl.program_id(2) + first_seq
    q_start = tl.load(cu_ptr + seq)
    q_len = tl.load(cu_ptr + seq + 1) - q_start
    n_tiles = tl.cdiv(q_len, BLOCK_M)
    if tl.program_id(1) >= n_tiles:
        return
    tile = n_tiles - 1 - tl.program_id(1)  # launch the longest (last) tiles first
    seq_len = tl.load(sl_ptr + seq)
    ctx = seq_len - q_len  # absolute position of the chunk's first query

    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    m_ok = m < q_len
    d_ok = d < HEAD_DIM
    q_rows = (q_start + m).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * s_qt + h * s_qh + d[None, :] * s_qd,
                mask=m_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    if not F32:
        if QUANT == 0:
            q = q.to(kc_ptr.dtype.element_ty)
        else:
            q = q.to(q_ptr.dtype.element_ty)
    q_pos = ctx + m
    q_real = q_pos  # the position a window counts from: a tree node's is root + depth, not its slot
    tm_rows = tm_ptr
    tk_ptr = td_ptr
    if TREE:
        q_real = ctx + tl.load(td_ptr + q_rows, mask=m_ok, other=0)
        tm_rows = tm_ptr + tl.where(m_ok, q_rows, q_start) * s_tm  # padded rows read a real row, unused
        tk_ptr = td_ptr + q_start  # the chunk's own keys are its query rows

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * s_btb
    head_off = (h // GROUP) * s_ch + d * s_cd
    s_head_off = (h // GROUP) * s_sh

    first_pos = ctx + tile * BLOCK_M
    full_end = (first_pos + 1) // BLOCK_N * BLOCK_N  # keys < full_end are seen by every row (causally)
    if TREE:  # a node need not see the nodes listed before it: only keys before the chunk are common
        full_end = tl.minimum(full_end, ctx // BLOCK_N * BLOCK_N)
    hi = tl.minimum(first_pos + BLOCK_M, seq_len)  # one past the last query's position
    mid = 0
    if WINDOWED:  # keys >= lo_w are seen by the first row, keys >= all_w by every row of the tile (padded ones too)
        lo_w = tl.maximum(first_pos - window + 1, 0) // BLOCK_N * BLOCK_N
        if TREE:  # a node's real position may lie below its slot, down to the root's
            lo_w = tl.maximum(ctx - window + 1, 0) // BLOCK_N * BLOCK_N
        all_w = tl.maximum(first_pos + BLOCK_M - window, 0)
        mid = tl.minimum(tl.maximum(tl.cdiv(all_w, BLOCK_N) * BLOCK_N, lo_w), full_end)
        acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, q_pos, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_row, head_off,
                                      s_head_off, d_ok, seq_len, qk_scale, s_cb, s_co, s_sb, s_so, lo_w, mid, window,
                                      q_real, tm_rows, tk_ptr, ctx, BLOCK_N, PAGE, F32, True, QUANT, True, TREE)
    acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, q_pos, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_row, head_off,
                                  s_head_off, d_ok, seq_len, qk_scale, s_cb, s_co, s_sb, s_so, mid, full_end, window,
                                  q_real, tm_rows, tk_ptr, ctx, BLOCK_N, PAGE, F32, False, QUANT, WINDOWED, TREE)
    acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, q_pos, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_row, head_off,
                                  s_head_off, d_ok, seq_len, qk_scale, s_cb, s_co, s_sb, s_so, full_end, hi, window,
                                  q_real, tm_rows, tk_ptr, ctx, BLOCK_N, PAGE, F32, True, QUANT, WINDOWED, TREE)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # padded rows past a windowed chunk may see no key
    tl.store(o_ptr + q_rows[:, None] * s_ot + h * s_oh + d[None, :] * s_od,
             cast_out(out, o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


GPU_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
    for bm, bn, w, st in [
        (128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (128, 32, 4, 3),
        (64, 64, 4, 3), (64, 64, 4, 4), (64, 32, 4, 4), (32, 32, 4, 3),
    ]
]
_GPU_DEFAULT = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}  # for the compile check
_tuned: dict[int, object] = {}  # one autotuner per query-length bucket: short chunks tune apart


def kernel_launcher(max_q: int):
    """Returns (kernel with grid bound later, fixed meta-params, BLOCK_M for the grid or None)."""
    if interpreting():
        bm = min(64, next_pow2(max_q, 16))
        return prefill_kernel, {"BLOCK_M": bm, "BLOCK_N": 64}
    bucket = min(next_pow2(max_q, 16), 4096)
    if bucket not in _tuned:
        _tuned[bucket] = triton.autotune(GPU_CONFIGS, key=["BLOCK_D", "PAGE", "GROUP", "QUANT", "WINDOWED", "TREE"])(
            prefill_kernel)
    return _tuned[bucket], {}


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, *,
    out: torch.Tensor | None = None, max_query_len: int | None = None, first_seq: int = 0,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, window: int | None = None,
    tree_mask: torch.Tensor | None = None, tree_depth: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T,H,D] packed; cu_seqlens_q int32 [S+1]; seq_lens int32 [S]; block_tables int32 [S, max_blocks].
    ``window``: query p attends to keys in (p - window, p] (None: all keys up to p).
    ``tree_mask`` bool [T, W] and ``tree_depth`` int32 [T] (attention/metadata.py): row r sees the
    keys before its chunk and its chunk's keys j with tree_mask[r, j]; its position is ctx + tree_depth[r].

    Returns [T,H,D] in q's dtype. Only sequences ``first_seq..S-1`` are computed
    (their rows of ``out``), so a caller can hand the decode sequences to the
    decode kernel. ``max_query_len`` sizes the grid; pass it to avoid a device sync.
    int8 / float8_e4m3fn caches need their scale pools ``k_scale``, ``v_scale`` [blocks, block_size, kvh].
    """
    T, H, D = q.shape
    kvh = k_cache.shape[2]
    assert k_cache.shape[3] == D and H % kvh == 0
    if out is None:
        out = torch.empty_like(q)
    num_seqs = seq_lens.shape[0] - first_seq
    if T == 0 or num_seqs <= 0:
        return out
    if max_query_len is None:
        max_query_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1])[first_seq:].max())
    kernel, extra = kernel_launcher(max_query_len)
    window = NO_WINDOW if window is None else int(window)
    assert 0 < window <= NO_WINDOW
    f32 = compute_in_f32(q.dtype if k_scale is not None else k_cache.dtype)  # codes widen to q's dtype
    quant, k_cache, v_cache, scales = quant_launch_args(k_cache, v_cache, k_scale, v_scale)

    tree = tree_mask is not None
    if tree:
        assert tree_depth is not None and tree_mask.shape[0] == T
        tm, td = tree_mask.to(torch.int8).contiguous(), tree_depth.to(torch.int32).contiguous()
    else:  # never read: the TREE branches are not compiled in
        tm, td = cu_seqlens_q, cu_seqlens_q

    def grid(meta):
        return (H, triton.cdiv(max_query_len, meta["BLOCK_M"]), num_seqs)

    kernel[grid](
        q, k_cache, v_cache, scales[0], scales[1], block_tables, cu_seqlens_q, seq_lens, out, tm, td,
        *q.stride(), *k_cache.stride(), *scales[2:], block_tables.stride(0), *out.stride(),
        tm.stride(0) if tree else 0, scale * LOG2E, first_seq, window,
        HEAD_DIM=D, GROUP=H // kvh, BLOCK_D=next_pow2(D, 16), PAGE=k_cache.shape[1],
        F32=f32, QUANT=quant, WINDOWED=window < NO_WINDOW, TREE=tree, **extra,
    )
    return out


def prefill_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, window: int | None = None,
    tree_mask: torch.Tensor | None = None, tree_depth: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain PyTorch, one sequence at a time, fp32 math, explicit offset-causal mask
    (quantized caches: dequantized K/V); ``window``: also masks keys at q_pos - window or before;
    ``tree_mask``/``tree_depth``: each chunk's own keys as its mask row says, positions root + depth."""
    from minillm.kernels.testing import gather_rows

    T, H, D = q.shape
    kvh, bs = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    for s, n in enumerate(seq_lens.tolist()):
        a, b = cu[s], cu[s + 1]
        if a == b:
            continue
        pos = torch.arange(n, device=q.device)
        blocks = block_tables[s].long()[pos // bs]
        k = gather_rows(k_cache, k_scale, blocks, pos % bs).repeat_interleave(H // kvh, dim=1)  # [n, H, D]
        v = gather_rows(v_cache, v_scale, blocks, pos % bs).repeat_interleave(H // kvh, dim=1)
        ctx = n - (b - a)
        qpos = torch.arange(ctx, n, device=q.device)
        kpos = pos
        visible = pos[None, :] <= qpos[:, None]
        if tree_mask is not None:
            qpos = ctx + tree_depth[a:b].long()
            kpos = torch.cat([pos[:ctx], qpos])
            visible = torch.cat([torch.ones((b - a, ctx), dtype=torch.bool, device=q.device),
                                 tree_mask[a:b, : b - a]], dim=1)
        if window is not None:
            visible &= kpos[None, :] > qpos[:, None] - window
        scores = torch.einsum("qhd,khd->hqk", q[a:b].float(), k) * scale
        scores.masked_fill_(~visible[None], float("-inf"))
        out[a:b] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(q.dtype)
    return out


def gpu_compile_specs(dtype: torch.dtype = torch.bfloat16, head_dim: int = 128, group: int = 4,
                      block_size: int = 16, configs: list | None = None, quant: int | None = None,
                      windowed: bool = False, tree: bool = False) -> list[tuple]:
    """(name, kernel, signature, options) for compile checks without a GPU.

    ``quant`` (kv_quant.QUANT_INT8 / QUANT_FP8): the quantized-cache variant, ``dtype`` being q's;
    by default bf16 also yields both quantized variants (default tile only). ``windowed``: the
    sliding-window variant (its extra key phase) instead; ``tree``: the tree-verification variant."""
    from minillm.kernels._common import TRITON_PTR
    from minillm.kernels.kv_quant import QUANT_FP8, QUANT_INT8, QUANT_NAME, QUANT_PTR

    if quant is None and dtype == torch.bfloat16 and not windowed and not tree:
        return gpu_compile_specs(dtype, head_dim, group, block_size, configs, quant=0) + [
            s for qm in (QUANT_INT8, QUANT_FP8)
            for s in gpu_compile_specs(dtype, head_dim, group, block_size, quant=qm)]
    quant = quant or 0
    p = TRITON_PTR[dtype]
    cp = QUANT_PTR[quant] if quant else p  # the code pools: int8, or fp8 as uint8 bits
    sp = "*fp32" if quant else p  # scale pools (a quant-less launch passes the caches, never read)
    kind = f"_{QUANT_NAME[quant]}kv" if quant else ""
    configs = configs or [_GPU_DEFAULT]
    specs = []
    for c in configs:
        sig = dict(q_ptr=p, kc_ptr=cp, vc_ptr=cp, ks_ptr=sp, vs_ptr=sp, bt_ptr="*i32", cu_ptr="*i32", sl_ptr="*i32",
                   o_ptr=p, tm_ptr="*i8" if tree else "*i32", td_ptr="*i32",
                   s_qt="i32:16", s_qh="i32:16", s_qd=1, s_cb="i32:16", s_co="i32:16", s_ch="i32:16", s_cd=1,
                   s_sb="i32", s_so="i32", s_sh=1 if quant else "i32",
                   s_btb="i32", s_ot="i32:16", s_oh="i32:16", s_od=1, s_tm="i32", qk_scale="fp32", first_seq="i32", window="i32",
                   HEAD_DIM=head_dim,
                   GROUP=group, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_D=next_pow2(head_dim, 16),
                   PAGE=block_size, F32=dtype == torch.float32, QUANT=quant, WINDOWED=windowed, TREE=tree)
        opts = {"num_warps": c["num_warps"], "num_stages": c["num_stages"]}
        tile = f"{c['BLOCK_M']}x{c['BLOCK_N']},w{c['num_warps']},s{c['num_stages']}"
        name = f"prefill{kind}{'_window' if windowed else ''}{'_tree' if tree else ''}[D{head_dim},G{group},{tile}]"
        specs.append((name, prefill_kernel, sig, opts))
    return specs


def all_gpu_configs() -> list[dict]:
    return [{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages} for c in GPU_CONFIGS]


def perf_report(
    seq_len: int = 4096, batch: int = 1, heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
    block_size: int = 16, dtype: torch.dtype = torch.bfloat16, roofs: dict | None = None, device: str = "cuda",
) -> dict:
    """GPU: causal prefill of ``batch`` prompts of ``seq_len`` tokens; TFLOP/s vs SDPA and the matmul roof."""
    import torch.nn.functional as F
    import triton.testing

    from minillm.kernels.testing import full_paged_pool

    kc, vc, bt, sl = full_paged_pool(batch, seq_len, kv_heads, head_dim, block_size, dtype, device)
    cu = torch.arange(0, batch + 1, dtype=torch.int32, device=device) * seq_len
    q = torch.randn(batch * seq_len, heads, head_dim, dtype=dtype, device=device)
    scale = head_dim**-0.5

    def fn():
        return prefill_attention(q, kc, vc, cu, sl, bt, scale, max_query_len=seq_len)

    # check every query of sequence 0 (the first 256 alone would miss the causal tail), 2,048 queries at a
    # time: a chunk [a, b) is the reference's prefill of queries a..b-1 over keys 0..b-1, so the scores
    # it materializes stay [H, 2048, b] rather than [H, L, L] (32 GiB in fp32 at 16k)
    out = fn()
    err = 0.0
    for a in range(0, seq_len, 2048):
        b = min(seq_len, a + 2048)
        cu_chunk = torch.tensor([0, b - a], dtype=torch.int32, device=device)
        ref = prefill_attention_ref(q[a:b], kc, vc, cu_chunk, torch.full_like(sl[:1], b), bt[:1], scale)
        err = max(err, (out[a:b].float() - ref.float()).abs().max().item())
    ms = triton.testing.do_bench(fn)
    # SDPA on the same (contiguous, unpaged) K/V: the peer to beat
    pos = torch.arange(seq_len, device=device)
    kd = kc[bt[0].long()[pos // block_size], pos % block_size].transpose(0, 1)[None]
    vd = vc[bt[0].long()[pos // block_size], pos % block_size].transpose(0, 1)[None]
    qd = q[:seq_len].transpose(0, 1)[None]
    kd, vd = kd.repeat_interleave(heads // kv_heads, 1), vd.repeat_interleave(heads // kv_heads, 1)
    sdpa_ms = batch * triton.testing.do_bench(
        lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale))
    flops = batch * 4 * heads * head_dim * seq_len * seq_len / 2  # causal: half of QK^T and PV
    rep = {"kernel": "prefill", "ok": err < 2e-2, "max_abs_err": err, "ms": ms, "TFLOPs": flops / ms / 1e9,
           "sdpa_ms": sdpa_ms, "frac_of_sdpa": sdpa_ms / ms,
           "shape": {"B": batch, "L": seq_len, "H": heads, "kvh": kv_heads, "D": head_dim,
                     "block_size": block_size, "dtype": str(dtype)}}
    try:
        from flash_attn import flash_attn_func  # optional peer

        fa_ms = batch * triton.testing.do_bench(
            lambda: flash_attn_func(qd.transpose(1, 2), kd.transpose(1, 2), vd.transpose(1, 2), causal=True))
        rep["flash_attn_ms"], rep["frac_of_flash_attn"] = fa_ms, fa_ms / ms
    except Exception:  # not installed or unsupported here
        pass
    if roofs:
        rep["frac_of_matmul_roof"] = rep["TFLOPs"] / roofs["matmul_TFLOPs"]
    return rep
