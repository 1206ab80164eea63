"""Paged decode attention: one new query token per sequence against its whole KV cache.

Algorithm
---------
One program owns one (sequence, kv head) pair. The ``GROUP = H / kv_heads``
query heads that share that kv head (GQA; MQA when kv_heads = 1, MHA when
GROUP = 1) are loaded once as the rows of a ``[GROUP_PAD, BLOCK_D]`` tile that
stays in registers for the whole program. ``tl.dot`` needs at least 16 rows on
a GPU, so the group is padded to 16 with masked (zero) rows that are never
stored; the head dim is padded to a power of two >= 16 the same way.

The program walks the sequence's keys in tiles of ``BLOCK_N`` tokens. A tile
may span several cache blocks: each token's block id is looked up in the block
table (``pos // block_size``) and its row addressed as ``block * stride_block +
(pos % block_size) * stride_offset``, so the block table can be any shuffled,
non-contiguous list of pages. Each K/V tile is read from HBM exactly once and
used by every query head of the group -- that reuse is the point of GQA.

Online softmax (in base 2: ``qk_scale = scale * log2(e)``, so ``exp2`` does the
work of ``exp``). Per query row keep the running max ``m``, the running sum
``l`` and the unnormalised output ``acc``; for each tile of scores ``s``::

    m_new = max(m, max_j s_j)
    p_j   = 2^(s_j - m_new)
    l     = l * 2^(m - m_new) + sum_j p_j
    acc   = acc * 2^(m - m_new) + p @ V
    m     = m_new

and the output is ``acc / l``. Keys past ``seq_len`` get score -inf (p = 0)
and are not even loaded (masked loads return 0), so a poisoned cache slot
beyond the sequence can never leak a NaN in.

Split-K ("flash-decoding"): with few sequences there are too few programs to
fill a GPU, so ``paged_decode_attention_split`` also splits each sequence's
keys into ``num_splits`` contiguous ranges, one program each. Every program
writes its partial ``(m, l, acc)``; a second kernel combines them::

    M = max_s m_s,   w_s = 2^(m_s - M),   out = sum_s w_s acc_s / sum_s w_s l_s

Empty splits (short sequences) write m = -inf, l = 0, acc = 0 and get w = 0.

Sliding window (``window``, Gemma 3's local layers): the query at position
``seq_len - 1`` sees keys in ``(seq_len - 1 - window, seq_len - 1]``, so the key
range simply starts at ``max(0, seq_len - window)`` instead of 0 and the splits
divide that range; keys outside it are never loaded. No window is a window
longer than any sequence (``NO_WINDOW``).

Dtypes: the cache can be fp32, fp16 or bf16. On a GPU narrow tiles feed the
tensor cores directly (fp32 accumulation); under the interpreter, and for
fp32 caches, tiles are widened to fp32 right after the load (the interpreter's
bf16 math is wrong). All softmax math is fp32.

Quantized caches (``QUANT`` 1: int8, 2: fp8 e4m3 as uint8 bits) hold codes
and one fp32 scale per (token, kv head). Codes are widened to fp32 (then to
q's dtype for tensor cores on a GPU; int8 and e4m3 values are exact in
fp16/bf16) and the scales are applied per key, not per element::

    s_j = (q . k_codes_j) * k_scale_j * qk_scale,   acc += (p_j * v_scale_j) @ v_codes

which equals attention over the dequantized K/V; ``l`` sums the unscaled p.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minillm.kernels._common import LOG2E, cast_out, compute_in_f32, interpreting, next_pow2
from minillm.kernels.kv_quant import codes_to_f32
from minillm.kernels.kv_store import quant_launch_args


@triton.jit
def decode_kernel(
    q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, bt_ptr, sl_ptr,
    o_ptr, m_ptr, l_ptr,  # NUM_SPLITS == 1: o is the final [B,H,D]; else fp32 partials
    s_qb, s_qh, s_qd,
    s_cb, s_co, s_ch, s_cd,
    s_sb, s_so, s_sh,  # strides of the scale pools (QUANT only)
    s_btb,
    s_ob, s_oh, s_os, s_od,  # output strides (s_os: split axis of the partials)
    qk_scale, window,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, NUM_SPLITS: tl.constexpr, F32: tl.constexpr,
    QUANT: tl.constexpr,
):
    """One program per (sequence, kv head, split): the group's query heads against the keys of its pages
    (the module docstring's algorithm). kernel_launcher picks its tiles; trace_tiles records it."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(sl_ptr + b)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, BLOCK_D)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    head = kvh * GROUP + g  # query heads of this group
    q = tl.load(q_ptr + b.to(tl.int64) * s_qb + head[:, None] * s_qh + d[None, :] * s_qd,
                mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    if not F32:
        if QUANT == 0:
            q = q.to(kc_ptr.dtype.element_ty)  # tensor cores want both operands narrow
        else:
            q = q.to(q_ptr.dtype.element_ty)  # codes are widened to q's dtype

    # this program's key range [start, end) within the window's [first, seq_len);
    # split sizes are whole tiles so only the last tile is ragged
    first = tl.maximum(seq_len - window, 0)
    per_split = tl.cdiv(tl.cdiv(seq_len - first, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = first + split * per_split
    end = tl.minimum(start + per_split, seq_len)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    n = tl.arange(0, BLOCK_N)
    bt_row = bt_ptr + b.to(tl.int64) * s_btb
    head_off = kvh * s_ch + d * s_cd
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + n
        valid = pos < end
        blk = tl.load(bt_row + pos // PAGE, mask=valid, other=0).to(tl.int64)
        row = blk * s_cb + (pos % PAGE) * s_co  # [BLOCK_N] element offsets of each token
        kv_mask = valid[:, None] & d_ok[None, :]
        k = tl.load(kc_ptr + row[:, None] + head_off[None, :], mask=kv_mask, other=0)
        if QUANT != 0:
            srow = blk * s_sb + (pos % PAGE) * s_so + kvh * s_sh
            k = codes_to_f32(k, QUANT).to(q.dtype)
        elif F32:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # [GROUP_PAD, BLOCK_N]
        if QUANT != 0:
            s = s * tl.load(ks_ptr + srow, mask=valid, other=0.0)[None, :]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile has >= 1 valid key
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vc_ptr + row[:, None] + head_off[None, :], mask=kv_mask, other=0)
        if QUANT != 0:
            v = codes_to_f32(v, QUANT).to(q.dtype)
            pv = p * tl.load(vs_ptr + srow, mask=valid, other=0.0)[None, :]
        else:
            if F32:
                v = v.to(tl.float32)
            pv = p
        acc = acc * alpha[:, None] + tl.dot(pv.to(v.dtype), v, input_precision="ieee")
        m_i = m_new

    o_off = b.to(tl.int64) * s_ob + head[:, None] * s_oh + d[None, :] * s_od
    o_mask = g_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(o_ptr + o_off, cast_out(out, o_ptr.dtype.element_ty), mask=o_mask)
    else:
        tl.store(o_ptr + o_off + split * s_os, acc, mask=o_mask)
        ml_off = (b * (tl.num_programs(1) * GROUP) + head) * NUM_SPLITS + split
        tl.store(m_ptr + ml_off, m_i, mask=g_ok)
        tl.store(l_ptr + ml_off, l_i, mask=g_ok)


@triton.jit
def combine_kernel(
    po_ptr, m_ptr, l_ptr, o_ptr,
    s_pb, s_ph, s_ps, s_pd,
    s_ob, s_oh, s_od,
    H,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (sequence, head): merge decode_kernel's NUM_SPLITS partial outputs by their max and sum."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, BLOCK_D)
    s_ok = s < NUM_SPLITS
    ml_off = (b * H + h) * NUM_SPLITS + s
    m = tl.load(m_ptr + ml_off, mask=s_ok, other=float("-inf"))
    l = tl.load(l_ptr + ml_off, mask=s_ok, other=0.0)
    m_all = tl.max(m, 0)
    w = tl.exp2(m - m_all)  # empty or padded splits: 2^-inf = 0
    denom = tl.sum(w * l, 0)
    po = tl.load(po_ptr + b.to(tl.int64) * s_pb + h * s_ph + s[:, None] * s_ps + d[None, :] * s_pd,
                 mask=s_ok[:, None] & (d < HEAD_DIM)[None, :], other=0.0)
    out = tl.sum(w[:, None] * po, 0) / denom
    o_off = b.to(tl.int64) * s_ob + h * s_oh + d * s_od
    tl.store(o_ptr + o_off, cast_out(out, o_ptr.dtype.element_ty), mask=d < HEAD_DIM)


# GPU tile choices; the interpreter uses one big fixed tile instead (cost ~ programs x iterations)
GPU_CONFIGS = [
    triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=st)
    for bn, w, st in [(32, 4, 2), (64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3), (128, 8, 3)]
]
_GPU_DEFAULT = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3}  # used by the compile check
_tuned = None
NO_WINDOW = 1 << 30  # a window longer than any context: full attention, same kernel, no extra specialisation


def kernel_launcher(grid):
    """Autotuned kernel on a GPU; fixed big-tile kernel in the interpreter."""
    global _tuned
    if interpreting():
        return decode_kernel[grid], {"BLOCK_N": 128}
    if _tuned is None:
        _tuned = triton.autotune(GPU_CONFIGS, key=["GROUP_PAD", "BLOCK_D", "PAGE", "NUM_SPLITS", "QUANT"])(
            decode_kernel)
    return _tuned[grid], {}


def _check(q: torch.Tensor, k_cache: torch.Tensor) -> tuple[int, int, int, int]:
    B, H, D = q.shape
    kvh = k_cache.shape[2]
    assert k_cache.shape[3] == D and H % kvh == 0, "heads must divide evenly into kv heads"
    return B, H, D, kvh


def _launch(q, k_cache, v_cache, block_tables, seq_lens, scale, out, num_splits, k_scale=None, v_scale=None,
            window=None):
    B, H, D, kvh = _check(q, k_cache)
    window = NO_WINDOW if window is None else int(window)
    assert 0 < window <= NO_WINDOW
    group = H // kvh
    f32 = compute_in_f32(q.dtype if k_scale is not None else k_cache.dtype)  # codes widen to q's dtype
    quant, k_cache, v_cache, scales = quant_launch_args(k_cache, v_cache, k_scale, v_scale)
    consts = dict(GROUP=group, GROUP_PAD=next_pow2(group, 16), BLOCK_D=next_pow2(D, 16),
                  PAGE=k_cache.shape[1], F32=f32, QUANT=quant)
    qk_scale = scale * LOG2E
    if num_splits == 1:
        run, extra = kernel_launcher((B, kvh, 1))
        run(q, k_cache, v_cache, scales[0], scales[1], block_tables, seq_lens, out, out, out,
            *q.stride(), *k_cache.stride(), *scales[2:], block_tables.stride(0),
            out.stride(0), out.stride(1), 0, out.stride(2),
            qk_scale, window, HEAD_DIM=D, NUM_SPLITS=1, **consts, **extra)
        return out
    po = torch.empty(B, H, num_splits, D, dtype=torch.float32, device=q.device)
    pm = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
    pl = torch.empty_like(pm)
    run, extra = kernel_launcher((B, kvh, num_splits))
    run(q, k_cache, v_cache, scales[0], scales[1], block_tables, seq_lens, po, pm, pl,
        *q.stride(), *k_cache.stride(), *scales[2:], block_tables.stride(0),
        po.stride(0), po.stride(1), po.stride(2), po.stride(3),
        qk_scale, window, HEAD_DIM=D, NUM_SPLITS=num_splits, **consts, **extra)
    combine_kernel[(B, H)](
        po, pm, pl, out, *po.stride(), *out.stride(), H, HEAD_DIM=D,
        NUM_SPLITS=num_splits, SPLITS_PAD=next_pow2(num_splits), BLOCK_D=next_pow2(D, 16),
    )
    return out


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, window: int | None = None,
) -> torch.Tensor:
    """q [B,H,D], caches [blocks, block_size, kvh, D], block_tables int32 [B, max_blocks],
    seq_lens int32 [B] (>= 1) -> [B,H,D] in q's dtype (written into ``out`` if given).
    int8 / float8_e4m3fn caches need their scale pools ``k_scale``, ``v_scale`` [blocks, block_size, kvh].
    ``window``: attend only to each sequence's last ``window`` keys (None: all)."""
    if out is None:
        out = torch.empty_like(q)
    if q.shape[0] == 0:
        return out
    return _launch(q, k_cache, v_cache, block_tables, seq_lens, scale, out, 1, k_scale, v_scale, window)


def paged_decode_attention_split(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, num_splits: int, out: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, window: int | None = None,
) -> torch.Tensor:
    """Flash-decoding: each sequence's keys (its last ``window`` with a window) split into ``num_splits``
    ranges, then combined."""
    if out is None:
        out = torch.empty_like(q)
    if q.shape[0] == 0:
        return out
    return _launch(q, k_cache, v_cache, block_tables, seq_lens, scale, out, max(1, int(num_splits)),
                   k_scale, v_scale, window)


def choose_num_splits(batch: int, kv_heads: int, max_seq_len: int, num_sms: int = 132) -> int:
    """Split only when the (sequence, kv head) programs leave SMs idle: then enough splits for ~2 programs
    per SM, keeping >= 256 keys per split. Measured on an H200 (132 SMs, bf16, 32/8 heads, head_dim 128):
    at batch 32 (256 programs) one split read 82% / 91% of the copy bandwidth at 2k / 4k keys, two splits
    70% / 90%, four 47% / 88%, so a batch that already fills the SMs is not split."""
    if interpreting():
        return 1
    programs = max(1, batch * kv_heads)
    if programs >= num_sms:
        return 1
    return max(1, min(math.ceil(2 * num_sms / programs), max_seq_len // 256, 64))


def paged_decode_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Plain PyTorch, one sequence at a time, fp32 math (quantized caches: dequantized K/V);
    with ``window`` only the keys at positions > seq_len - 1 - window."""
    from minillm.kernels.testing import gather_rows

    B, H, D, kvh = _check(q, k_cache)
    bs = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(seq_lens[b])
        pos = torch.arange(n, device=q.device)
        if window is not None:
            pos = pos[(n - 1) - pos < window]
        blocks = block_tables[b].long()[pos // bs]
        k = gather_rows(k_cache, k_scale, blocks, pos % bs)  # [n, kvh, D] fp32
        v = gather_rows(v_cache, v_scale, blocks, pos % bs)
        k = k.repeat_interleave(H // kvh, dim=1)  # query head h reads kv head h // group
        v = v.repeat_interleave(H // kvh, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale
        out[b] = torch.einsum("hn,nhd->hd", s.softmax(-1), v).to(q.dtype)
    return out


def gpu_compile_specs(dtype: torch.dtype = torch.bfloat16, head_dim: int = 128, group: int = 4,
                      block_size: int = 16, config: dict | None = None, quant: int | None = None) -> list[tuple]:
    """(name, kernel, signature, options) for compile checks without a GPU.

    ``quant`` (kv_quant.QUANT_INT8 / QUANT_FP8): the quantized-cache variant, ``dtype`` being q's;
    by default bf16 also yields both quantized variants (they are what an int8/fp8 cache runs)."""
    from minillm.kernels._common import TRITON_PTR
    from minillm.kernels.kv_quant import QUANT_FP8, QUANT_INT8, QUANT_NAME, QUANT_PTR

    if quant is None and dtype == torch.bfloat16:
        return [s for qm in (0, QUANT_INT8, QUANT_FP8)
                for s in gpu_compile_specs(dtype, head_dim, group, block_size, config, quant=qm)]
    quant = quant or 0
    p = TRITON_PTR[dtype]
    cp = QUANT_PTR[quant] if quant else p  # the code pools: int8, or fp8 as uint8 bits
    sp = "*fp32" if quant else p  # scale pools (a quant-less launch passes the caches, never read)
    c = config or _GPU_DEFAULT
    consts = dict(GROUP=group, GROUP_PAD=next_pow2(group, 16), BLOCK_D=next_pow2(head_dim, 16),
                  PAGE=block_size, F32=dtype == torch.float32, QUANT=quant)
    specs = []
    for splits in (1, 8) if not quant else (1,):  # splitting does not touch the cache reads
        sig = dict(q_ptr=p, kc_ptr=cp, vc_ptr=cp, ks_ptr=sp, vs_ptr=sp, bt_ptr="*i32", sl_ptr="*i32",
                   o_ptr=p if splits == 1 else "*fp32", m_ptr="*fp32", l_ptr="*fp32",
                   s_qb="i32:16", s_qh="i32:16", s_qd=1, s_cb="i32:16", s_co="i32:16", s_ch="i32:16", s_cd=1,
                   s_sb="i32", s_so="i32", s_sh=1 if quant else "i32",
                   s_btb="i32", s_ob="i32:16", s_oh="i32:16", s_os="i32:16" if splits > 1 else 0, s_od=1,
                   qk_scale="fp32", window="i32", HEAD_DIM=head_dim, NUM_SPLITS=splits, BLOCK_N=c["BLOCK_N"], **consts)
        opts = {"num_warps": c["num_warps"], "num_stages": c["num_stages"]}
        tile = f"N{c['BLOCK_N']},w{c['num_warps']},s{c['num_stages']}"
        kind = f"_{QUANT_NAME[quant]}kv" if quant else ""
        name = f"paged_decode{kind}[D{head_dim},G{group},splits={splits},{tile}]"
        specs.append((name, decode_kernel, sig, opts))
    if quant:
        return specs  # the combine kernel reads fp32 partials whatever the cache holds
    sig = dict(po_ptr="*fp32", m_ptr="*fp32", l_ptr="*fp32", o_ptr=p,
               s_pb="i32:16", s_ph="i32:16", s_ps="i32:16", s_pd=1, s_ob="i32:16", s_oh="i32:16", s_od=1,
               H="i32", HEAD_DIM=head_dim, NUM_SPLITS=8, SPLITS_PAD=8, BLOCK_D=next_pow2(head_dim, 16))
    specs.append(("paged_decode_combine", combine_kernel, sig, {"num_warps": 4, "num_stages": 1}))
    return specs


def _sdpa_peer(q, kc, vc, bt, ctx, scale, ms) -> dict:
    """Time torch SDPA on the same K/V laid out dense and contiguous (its best case)."""
    import torch.nn.functional as F
    import triton.testing

    B, H, D = q.shape
    bs = kc.shape[1]
    pos = torch.arange(ctx, device=q.device)
    idx = bt.long()[:, pos // bs]  # [B, ctx]
    kd = kc[idx, pos % bs].transpose(1, 2)  # [B, kvh, ctx, D]
    vd = vc[idx, pos % bs].transpose(1, 2)
    qd = q[:, :, None, :]  # [B, H, 1, D]
    try:
        sdpa_ms = triton.testing.do_bench(
            lambda: F.scaled_dot_product_attention(qd, kd, vd, scale=scale, enable_gqa=True))
        how = "dense K/V, enable_gqa"
    except (TypeError, RuntimeError):
        r = H // kc.shape[2]
        kd, vd = kd.repeat_interleave(r, 1), vd.repeat_interleave(r, 1)
        sdpa_ms = triton.testing.do_bench(lambda: F.scaled_dot_product_attention(qd, kd, vd, scale=scale))
        how = "dense K/V repeated per query head"
    return {"sdpa_ms": sdpa_ms, "sdpa_layout": how, "frac_of_sdpa": sdpa_ms / ms}


def perf_report(
    batch: int = 64, ctx: int = 4096, heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
    block_size: int = 16, dtype: torch.dtype = torch.bfloat16, roofs: dict | None = None,
    device: str = "cuda", num_splits: int | None = None,
) -> dict:
    """GPU: time paged decode on a shuffled pool; GB/s of K/V read vs the measured copy roof."""
    import triton.testing

    from minillm.kernels.testing import full_paged_pool

    kc, vc, bt, sl = full_paged_pool(batch, ctx, kv_heads, head_dim, block_size, dtype, device)
    q = torch.randn(batch, heads, head_dim, dtype=dtype, device=device)
    scale = head_dim**-0.5
    if num_splits is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        num_splits = choose_num_splits(batch, kv_heads, ctx, sms)

    def fn():
        return paged_decode_attention_split(q, kc, vc, bt, sl, scale, num_splits)

    ref = paged_decode_attention_ref(q[:2], kc, vc, bt[:2], sl[:2], scale).float()
    err = (fn()[:2].float() - ref).abs().max().item()
    ms = triton.testing.do_bench(fn)
    kv_bytes = 2 * batch * ctx * kv_heads * head_dim * kc.element_size()
    gbs = kv_bytes / (ms * 1e-3) / 1e9
    rep = {"kernel": "paged_decode", "ok": err < 2e-2, "max_abs_err": err, "ms": ms, "GBps": gbs,
           "num_splits": num_splits,
           "shape": {"B": batch, "ctx": ctx, "H": heads, "kvh": kv_heads, "D": head_dim,
                     "block_size": block_size, "dtype": str(dtype)}}
    rep.update(_sdpa_peer(q, kc, vc, bt, ctx, scale, ms))
    if roofs:
        rep["frac_of_copy_bw"] = gbs / roofs["copy_GBps"]
    return rep
