"""Triton kernels on int8 / fp8 (e4m3) KV caches vs their plain-PyTorch references.

Runs on a GPU when there is one, else under the Triton interpreter on CPU.

* The quantizing store must write bit-for-bit what minillm.attention.kv_quant
  writes (the torch backend's store): same codes, same scales. Rows are built
  so that every rounding case is hit: int8 ties (x.5, round half to even),
  every e4m3 code, the midpoints between neighbouring codes and one ulp either
  side of them, and the subnormal range.
* Decode, split decode and prefill must match the reference attention over the
  dequantized cache (codes * scales) to fp32 summation-order tolerance; the
  reference must itself stay close to attention over the float cache.
* Every quantized variant compiles for sm80 / sm90 (GPU compile check, subprocess).
"""
import json
import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from minillm.attention.kv_quant import as_bits  # noqa: E402
from minillm.kernels.kv_store import store_kv_cache, store_kv_cache_quant_ref  # noqa: E402
from minillm.kernels.paged_decode import (  # noqa: E402
    paged_decode_attention, paged_decode_attention_ref, paged_decode_attention_split,
)
from minillm.kernels.prefill import prefill_attention, prefill_attention_ref  # noqa: E402
from minillm.kernels.testing import assert_attention_close, make_paged_workload, quantize_workload  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
QDTYPES = [torch.int8, torch.float8_e4m3fn]
QIDS = ["int8", "fp8"]


def e4m3_probe_values() -> torch.Tensor:
    """Every finite e4m3 value, the midpoints between neighbours and one fp32 ulp either side, both signs."""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mids = (codes[:-1] + codes[1:]) / 2
    ulp_up = torch.nextafter(mids, torch.tensor(1e9))
    ulp_dn = torch.nextafter(mids, torch.tensor(0.0))
    v = torch.cat([codes, mids, ulp_up, ulp_dn])
    return torch.cat([v, -v])


def rows_with_amax(values: torch.Tensor, qmax: float, d: int) -> torch.Tensor:
    """Pack ``values`` into rows of ``d`` whose first element is ``qmax``: scale = 1, codes = values."""
    per_row = d - 1
    n = -(-values.numel() // per_row)
    body = torch.zeros(n * per_row)
    body[: values.numel()] = values
    return torch.cat([torch.full((n, 1), qmax), body.view(n, per_row)], dim=1)


def store_case(qdtype: torch.dtype, src_dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    kvh, d, bs = 3, 40, 16  # head_dim 40: padded lanes in the kernel's tile
    if qdtype == torch.int8:
        probes = torch.arange(-127, 127.5, 0.5)  # every half step: ties round to even
        probes = torch.cat([probes, torch.nextafter(probes, torch.tensor(1e9))])
        special = rows_with_amax(probes, 127.0, d)
    else:
        special = rows_with_amax(e4m3_probe_values(), 448.0, d)
    special = special[torch.randperm(special.shape[0], generator=g)]
    T0 = -(-special.shape[0] // kvh)
    padded = torch.zeros(T0 * kvh, d)
    padded[: special.shape[0]] = special
    # plus random rows over 12 orders of magnitude (tiny values land in fp8's subnormals), and a zero head
    rnd = torch.randn(17, kvh, d, generator=g) * torch.logspace(-6, 6, 17)[:, None, None]
    rnd[4, 1] = 0.0
    k = torch.cat([padded.view(T0, kvh, d), rnd]).to(src_dtype)
    v = torch.cat([rnd, -padded.view(T0, kvh, d)]).to(src_dtype)
    T = k.shape[0]
    nb = -(-(T + 8) // bs)
    slots = torch.randperm(nb * bs, generator=g)[:T]
    slots[[3, T - 2]] = -1  # padding tokens: must not be written
    return k, v, slots, (nb, bs, kvh, d)


@pytest.mark.parametrize("src_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("qdtype", QDTYPES, ids=QIDS)
def test_quant_store_is_bit_exact(qdtype, src_dtype):
    k, v, slots, shape = store_case(qdtype, src_dtype, seed=7)
    pools = []
    for _ in range(2):  # kernel, reference
        codes = [torch.zeros(shape, dtype=qdtype, device=DEV) for _ in range(2)]
        scales = [torch.full(shape[:3], float("nan"), device=DEV) for _ in range(2)]  # NaN: never written
        pools.append((codes, scales))
    (kc, vc), (ks, vs) = pools[0]
    store_kv_cache(k.to(DEV), v.to(DEV), kc, vc, slots.to(DEV), k_scale=ks, v_scale=vs)
    (kr, vr), (ksr, vsr) = pools[1]
    store_kv_cache_quant_ref(k.to(DEV), v.to(DEV), kr, vr, slots.to(DEV), ksr, vsr)
    for got, want in ((kc, kr), (vc, vr)):
        assert torch.equal(as_bits(got).cpu(), as_bits(want).cpu())
    for got, want in ((ks, ksr), (vs, vsr)):
        assert torch.equal(got.isnan(), want.isnan())  # the padding slots and the unused ones stay NaN
        assert torch.equal(got.nan_to_num(-1), want.nan_to_num(-1))
    written = (~ks.isnan()).sum().item()
    assert written == (slots >= 0).sum().item() * shape[2]
    # the probe rows really were stored with scale 1 (so every code path above was exercised)
    assert (ks == 1.0).sum().item() >= 10


# (heads, kv_heads, head_dim, block_size, seq_lens): GQA 9:3 like the default model, MQA, odd head dim
DECODE_CASES = [
    (9, 3, 64, 16, [1, 70, 130]),
    (8, 1, 40, 32, [33, 200]),
]


@pytest.mark.parametrize("qdtype", QDTYPES, ids=QIDS)
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: f"h{c[0]}kv{c[1]}d{c[2]}bs{c[3]}")
def test_quant_paged_decode(case, qdtype):
    h, kvh, d, bs, lens = case
    w = make_paged_workload([1] * len(lens), lens, h, kvh, d, bs, torch.float32, seed=d, device=DEV)
    kq, vq, ksc, vsc = quantize_workload(w, qdtype)  # unwritten slots: NaN scales
    scale = d**-0.5
    ref = paged_decode_attention_ref(w.q, kq, vq, w.block_tables, w.seq_lens, scale, ksc, vsc)
    for splits in (1, 3):
        out = torch.full_like(w.q, float("nan"))
        if splits == 1:
            paged_decode_attention(w.q, kq, vq, w.block_tables, w.seq_lens, scale, out=out, k_scale=ksc, v_scale=vsc)
        else:
            paged_decode_attention_split(w.q, kq, vq, w.block_tables, w.seq_lens, scale, splits, out=out,
                                         k_scale=ksc, v_scale=vsc)
        assert_attention_close(out, ref, torch.float32)
    # and the quantized attention is close to attention over the float cache (the scheme, not just the kernel)
    fref = paged_decode_attention_ref(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, scale)
    tol = 0.03 if qdtype == torch.int8 else 0.2
    assert (ref - fref).abs().max().item() < tol


@pytest.mark.parametrize("qdtype", QDTYPES, ids=QIDS)
def test_quant_prefill(qdtype):
    # a whole prompt, a chunk after a cached prefix, a one-token chunk, in one packed batch
    h, kvh, d, bs = 9, 3, 64, 16
    w = make_paged_workload([23, 40, 1], [23, 110, 50], h, kvh, d, bs, torch.float32, seed=5, device=DEV)
    kq, vq, ksc, vsc = quantize_workload(w, qdtype)
    scale = d**-0.5
    ref = prefill_attention_ref(w.q, kq, vq, w.cu_seqlens_q, w.seq_lens, w.block_tables, scale, ksc, vsc)
    out = torch.full_like(w.q, float("nan"))
    prefill_attention(w.q, kq, vq, w.cu_seqlens_q, w.seq_lens, w.block_tables, scale, out=out,
                      k_scale=ksc, v_scale=vsc)
    assert_attention_close(out, ref, torch.float32)
    fref = prefill_attention_ref(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, scale)
    tol = 0.03 if qdtype == torch.int8 else 0.2
    assert (ref - fref).abs().max().item() < tol


def test_quant_kernels_reject_bad_cache_dtype():
    w = make_paged_workload([1], [5], 4, 2, 16, 16, torch.float32, seed=1)
    kq, vq, ksc, vsc = quantize_workload(w, torch.int8)
    with pytest.raises(ValueError, match="int8 or float8_e4m3fn"):
        paged_decode_attention(w.q, kq.to(torch.float16), vq.to(torch.float16), w.block_tables, w.seq_lens, 0.25,
                               k_scale=ksc, v_scale=vsc)


_COMPILE_QUANT = """
import json, sys, torch
from minillm.kernels import kv_store, paged_decode, prefill
from minillm.kernels._common import gpu_compile
specs = [s for s in kv_store.gpu_compile_specs(torch.bfloat16, 64, 3) if s[0].endswith("kv")]
for q in (1, 2):
    specs += paged_decode.gpu_compile_specs(torch.bfloat16, 64, 3, quant=q)
    specs += prefill.gpu_compile_specs(torch.bfloat16, 64, 3, quant=q)
rows = []
for arch in (80, 90):
    for name, fn, sig, opts in specs:
        try:
            k = gpu_compile(fn, sig, arch, **opts)
            rows.append({"arch": arch, "kernel": name, "ok": "cubin" in k.asm, "shared": k.metadata.shared})
        except Exception as e:
            rows.append({"arch": arch, "kernel": name, "ok": False, "error": str(e)[-600:]})
json.dump(rows, open(sys.argv[1], "w"))
"""


@pytest.mark.slow
def test_quant_kernels_compile_for_gpu(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-c", _COMPILE_QUANT, str(out)], env={**os.environ, "TRITON_INTERPRET": "0"},
                          capture_output=True, text=True, timeout=300)
    assert out.exists(), proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert all(r["ok"] for r in rows), json.dumps([r for r in rows if not r["ok"]], indent=1)
    names = {r["kernel"].split("[")[0] for r in rows}
    assert names == {f"{k}_{q}kv" for k in ("store_kv_cache", "paged_decode", "prefill") for q in ("int8", "fp8")}
    assert {r["arch"] for r in rows} == {80, 90}
