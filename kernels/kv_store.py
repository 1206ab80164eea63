"""Write this step's new keys and values into the paged KV cache.

Algorithm
---------
The cache of one layer is ``[num_blocks, block_size, num_kv_heads, head_dim]``
and token ``t`` goes to flat slot ``slot_mapping[t] = block * block_size +
offset``. Each program copies a tile of ``BLOCK_T`` tokens; for each token the
whole ``num_kv_heads x head_dim`` row is one flattened axis of the tile
(``BLOCK_H * BLOCK_D`` lanes, padded to powers of two and masked), so one
program moves K and V for several tokens with wide, coalesced accesses. The
slot is split into (block, offset) so arbitrary cache strides work.

Masks: ``t < T`` drops the ragged last tile, ``h < KVH`` and ``d < HEAD_DIM``
drop the power-of-two padding, and ``slot >= 0`` lets a caller mark padding tokens with
slot -1 (nothing is written for them).

Nothing stays in SRAM between tokens: this is a pure gather/scatter, bound by
memory bandwidth, so its perf report is in GB/s against the measured copy
bandwidth. Values go through fp32 on the way to the cache dtype because the
interpreter cannot cast fp16 <-> bf16 directly (it reinterprets the bits), and
``cast_out`` rounds to nearest-even there as the GPU does.

Quantized caches (int8 / fp8 e4m3, ``store_kv_cache(..., k_scale=, v_scale=)``)
use a second kernel whose tile is ``[BLOCK_T, BLOCK_H, BLOCK_D]``: the max
over the head-dim axis gives each (token, head) its scale ``amax / qmax``,
the row is divided, rounded to codes (kernels/kv_quant.py) and written with
its scale to ``[num_blocks, block_size, kv_heads]`` scale pools -- the same
bits minillm.attention.kv_quant.quantize_kv produces.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.attention.kv_quant import as_bits  # fp8 pools reach the kernels as uint8 bits
from minillm.kernels._common import cast_out, interpreting, next_pow2
from minillm.kernels.kv_quant import QUANT_FP8, QUANT_INT8, quantize_rows


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    T,
    s_kt, s_kh, s_kd,  # strides of k (v shares them; the wrapper checks)
    s_vt, s_vh, s_vd,
    s_cb, s_co, s_ch, s_cd,  # strides of the caches (k_cache and v_cache share them)
    KVH: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block (page)
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    j = tl.arange(0, BLOCK_H * BLOCK_D)  # flattened (head, dim) lane
    h = j // BLOCK_D
    d = j % BLOCK_D
    t_ok = t < T
    slot = tl.load(slot_ptr + t, mask=t_ok, other=-1).to(tl.int64)
    row_ok = t_ok & (slot >= 0)
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    mask = row_ok[:, None] & ((h < KVH) & (d < HEAD_DIM))[None, :]
    t64 = t.to(tl.int64)

    src_k = k_ptr + t64[:, None] * s_kt + (h * s_kh + d * s_kd)[None, :]
    src_v = v_ptr + t64[:, None] * s_vt + (h * s_vh + d * s_vd)[None, :]
    dst = (blk * s_cb + off * s_co)[:, None] + (h * s_ch + d * s_cd)[None, :]
    kv = tl.load(src_k, mask=mask).to(tl.float32)
    tl.store(kc_ptr + dst, cast_out(kv, kc_ptr.dtype.element_ty), mask=mask)
    vv = tl.load(src_v, mask=mask).to(tl.float32)
    tl.store(vc_ptr + dst, cast_out(vv, vc_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quant_store_one(src_ptr, dst_ptr, sdst_ptr, src_off, dst_off, sdst_off, mask3, mask2, QUANT: tl.constexpr):
    x = tl.load(src_ptr + src_off, mask=mask3, other=0.0).to(tl.float32)
    codes, scale = quantize_rows(x, QUANT)
    tl.store(dst_ptr + dst_off, codes, mask=mask3)
    tl.store(sdst_ptr + sdst_off, scale, mask=mask2)


@triton.jit
def _store_kv_quant_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, slot_ptr,
    T,
    s_kt, s_kh, s_kd,
    s_vt, s_vh, s_vd,
    s_cb, s_co, s_ch, s_cd,  # strides of the code caches (shared by k and v)
    s_sb, s_so, s_sh,  # strides of the scale pools (shared by k and v)
    KVH: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, QUANT: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    t_ok = t < T
    slot = tl.load(slot_ptr + t, mask=t_ok, other=-1).to(tl.int64)
    row_ok = t_ok & (slot >= 0)
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    mask2 = row_ok[:, None] & (h < KVH)[None, :]
    mask3 = mask2[:, :, None] & (d < HEAD_DIM)[None, None, :]
    t64 = t.to(tl.int64)
    h3, d3 = h[None, :, None], d[None, None, :]
    dst = (blk * s_cb + off * s_co)[:, None, None] + h3 * s_ch + d3 * s_cd
    sdst = (blk * s_sb + off * s_so)[:, None] + h[None, :] * s_sh
    _quant_store_one(k_ptr, kc_ptr, ks_ptr, t64[:, None, None] * s_kt + h3 * s_kh + d3 * s_kd, dst, sdst,
                     mask3, mask2, QUANT)
    _quant_store_one(v_ptr, vc_ptr, vs_ptr, t64[:, None, None] * s_vt + h3 * s_vh + d3 * s_vd, dst, sdst,
                     mask3, mask2, QUANT)


def quant_mode(cache: torch.Tensor) -> int:
    """QUANT constexpr of a code cache: int8 -> 1, float8_e4m3fn -> 2."""
    if cache.dtype == torch.int8:
        return QUANT_INT8
    if cache.dtype == torch.float8_e4m3fn:
        return QUANT_FP8
    raise ValueError(f"a quantized KV cache must be int8 or float8_e4m3fn, not {cache.dtype}")


def quant_launch_args(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor | None,
                      v_scale: torch.Tensor | None) -> tuple[int, torch.Tensor, torch.Tensor, tuple]:
    """(QUANT, k_cache, v_cache, (k_scale, v_scale, *scale strides)) as the attention kernels take them.

    Float caches pass themselves as placeholder scale pointers (QUANT == 0 never reads them)."""
    if k_scale is None:
        return 0, k_cache, v_cache, (k_cache, v_cache, 0, 0, 0)
    assert v_scale is not None and k_scale.stride() == v_scale.stride()
    return quant_mode(k_cache), as_bits(k_cache), as_bits(v_cache), (k_scale, v_scale, *k_scale.stride())


def _launch_params(T: int, kvh: int, d: int) -> dict:
    bh, bd = next_pow2(kvh), next_pow2(d)
    # about 4K lanes per program on a GPU; in the interpreter, fewer bigger programs
    lanes = 1 << 15 if interpreting() else 1 << 12
    bt = max(1, min(next_pow2(T), lanes // (bh * bd)))
    return {"BLOCK_T": bt, "BLOCK_H": bh, "BLOCK_D": bd}


def store_kv_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:
    """k, v: [T, kv_heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim]; in place.

    With ``k_scale``/``v_scale`` ([num_blocks, block_size, kv_heads] fp32) the caches are int8 or
    float8_e4m3fn and each token's heads are quantized with their own scale."""
    T, kvh, d = k.shape
    if T == 0:
        return
    assert v.shape == k.shape and k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.shape[2:] == (kvh, d)
    p = _launch_params(T, kvh, d)
    grid = (triton.cdiv(T, p["BLOCK_T"]),)
    if k_scale is not None:
        assert v_scale is not None and k_scale.stride() == v_scale.stride() and k_scale.shape == k_cache.shape[:3]
        _store_kv_quant_kernel[grid](
            k, v, as_bits(k_cache), as_bits(v_cache), k_scale, v_scale, slot_mapping,
            T,
            *k.stride(), *v.stride(), *k_cache.stride(), *k_scale.stride(),
            KVH=kvh, HEAD_DIM=d, BLOCK_SIZE=k_cache.shape[1], QUANT=quant_mode(k_cache), **p,
        )
        return
    _store_kv_kernel[grid](
        k, v, k_cache, v_cache, slot_mapping,
        T,
        *k.stride(), *v.stride(), *k_cache.stride(),
        KVH=kvh, HEAD_DIM=d, BLOCK_SIZE=k_cache.shape[1], **p,
    )


def store_kv_cache_ref(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Plain-PyTorch reference: scatter each token's row to its flat slot (slot < 0: skipped)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    kvh, d = k.shape[1], k.shape[2]
    k_cache.view(-1, kvh, d)[slots] = k[keep].to(k_cache.dtype)
    v_cache.view(-1, kvh, d)[slots] = v[keep].to(v_cache.dtype)


def store_kv_cache_quant_ref(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: torch.Tensor, v_scale: torch.Tensor,
) -> None:
    """Plain-PyTorch reference of the quantizing store (minillm.attention.kv_quant.quantize_kv)."""
    from minillm.attention.kv_quant import quantize_kv

    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    kvh, d = k.shape[1], k.shape[2]
    for x, cache, scales in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        codes, s = quantize_kv(x[keep], cache.dtype)
        as_bits(cache).view(-1, kvh, d)[slots] = as_bits(codes)
        scales.view(-1, kvh)[slots] = s


def gpu_compile_specs(dtype: torch.dtype = torch.bfloat16, head_dim: int = 128, kv_heads: int = 8,
                      block_size: int = 16) -> list[tuple]:
    """(name, kernel, signature, options) for compile checks without a GPU.

    bf16 also yields the quantizing store into int8 and fp8 (uint8 bits) pools."""
    from minillm.kernels._common import TRITON_PTR
    from minillm.kernels.kv_quant import QUANT_NAME, QUANT_PTR

    p = TRITON_PTR[dtype]
    bh, bd = next_pow2(kv_heads), next_pow2(head_dim)
    sig = dict(k_ptr=p, v_ptr=p, kc_ptr=p, vc_ptr=p, slot_ptr="*i64", T="i32",
               s_kt="i32:16", s_kh="i32:16", s_kd=1, s_vt="i32:16", s_vh="i32:16", s_vd=1,
               s_cb="i32:16", s_co="i32:16", s_ch="i32:16", s_cd=1,
               KVH=kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
               BLOCK_T=max(1, 4096 // (bh * bd)), BLOCK_H=bh, BLOCK_D=bd)
    specs = [("store_kv_cache", _store_kv_kernel, sig, {"num_warps": 4, "num_stages": 1})]
    if dtype == torch.bfloat16:
        for quant, cp in QUANT_PTR.items():
            qsig = {**sig, "kc_ptr": cp, "vc_ptr": cp, "ks_ptr": "*fp32", "vs_ptr": "*fp32",
                    "s_sb": "i32", "s_so": "i32", "s_sh": 1, "QUANT": quant}
            specs.append((f"store_kv_cache_{QUANT_NAME[quant]}kv", _store_kv_quant_kernel, qsig,
                          {"num_warps": 4, "num_stages": 1}))
    return specs


def perf_report(
    num_tokens: int = 8192, kv_heads: int = 8, head_dim: int = 128, block_size: int = 16,
    dtype: torch.dtype = torch.bfloat16, roofs: dict | None = None, device: str = "cuda",
) -> dict:
    """GPU: time store_kv_cache on a prefill-sized batch; GB/s vs the measured copy roof."""
    import triton.testing

    num_blocks = num_tokens // block_size * 2
    k = torch.randn(num_tokens, kv_heads, head_dim, dtype=dtype, device=device)
    v = torch.randn_like(k)
    kc = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=device)
    vc = torch.zeros_like(kc)
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    store_kv_cache(k, v, kc, vc, slots)
    kr, vr = torch.zeros_like(kc), torch.zeros_like(vc)
    store_kv_cache_ref(k, v, kr, vr, slots)
    err = max((kc.float() - kr.float()).abs().max().item(), (vc.float() - vr.float()).abs().max().item())
    ms = triton.testing.do_bench(lambda: store_kv_cache(k, v, kc, vc, slots))
    nbytes = 4 * k.numel() * k.element_size() + slots.numel() * 8  # read k, v; write both
    gbs = nbytes / (ms * 1e-3) / 1e9
    rep = {"kernel": "store_kv_cache", "ok": err == 0.0, "max_abs_err": err, "ms": ms, "GBps": gbs,
           "shape": {"T": num_tokens, "kvh": kv_heads, "D": head_dim, "dtype": str(dtype)}}
    if roofs:
        rep["frac_of_copy_bw"] = gbs / roofs["copy_GBps"]
    return rep
