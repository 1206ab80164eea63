"""Check and time the Triton kernels on a CUDA GPU: ``python -m minillm.kernels.bench``.

Every kernel is first checked against its plain-PyTorch reference on small
random paged workloads (all dtypes), then timed with ``triton.testing.do_bench``
on the target shapes and set against roofs measured on this device (a large
copy for bandwidth, a large bf16 matmul for compute) and against torch SDPA
(and flash-attn when installed). Prints a short table and writes JSON.

Targets on an H200: paged decode >= 70% of copy bandwidth at batch 64 x 4k
context; prefill >= 60% of SDPA's throughput at 4k tokens (head_dim 128, bf16).

Without a GPU it says so, runs a tiny interpreter check and exits 0.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

TARGETS = {"paged_decode": ("frac_of_copy_bw", 0.70), "prefill": ("frac_of_sdpa", 0.60)}


def check_all(device: str, dtypes=(torch.float32, torch.float16, torch.bfloat16), small: bool = False) -> list[dict]:
    """Each kernel vs its reference on a mixed paged workload; max abs error per dtype."""
    from minillm.kernels.kv_store import store_kv_cache, store_kv_cache_ref
    from minillm.kernels.paged_decode import (
        paged_decode_attention, paged_decode_attention_ref, paged_decode_attention_split,
    )
    from minillm.kernels.prefill import prefill_attention, prefill_attention_ref
    from minillm.kernels.testing import make_paged_workload, max_err

    tol = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
    h, kvh, d, bs = (9, 3, 64, 16) if small else (32, 8, 128, 16)
    lens = [1, 40, 77] if small else [1, 300, 1000, 2049]
    rows = []
    for dtype in dtypes:
        w = make_paged_workload([1] * len(lens), lens, h, kvh, d, bs, dtype, seed=0, device=device)
        s = d**-0.5
        ref = paged_decode_attention_ref(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, s)
        args = (w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, s)
        errs = {
            "paged_decode": max_err(paged_decode_attention(*args), ref),
            "paged_decode_split": max_err(paged_decode_attention_split(*args, 4), ref),
        }
        qlens = [3, 40, 60] if small else [17, 300, 1000, 129]
        plens = [3, 70, 60] if small else [17, 600, 1000, 2049]
        w = make_paged_workload(qlens, plens, h, kvh, d, bs, dtype, seed=1, device=device)
        args = (w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, s)
        errs["prefill"] = max_err(prefill_attention(*args), prefill_attention_ref(*args))
        kc, vc = torch.zeros_like(w.k_cache), torch.zeros_like(w.v_cache)
        kr, vr = kc.clone(), vc.clone()
        store_kv_cache(w.k_new, w.v_new, kc, vc, w.slot_mapping)
        store_kv_cache_ref(w.k_new, w.v_new, kr, vr, w.slot_mapping)
        errs["store_kv_cache"] = max(max_err(kc, kr), max_err(vc, vr))
        for name, e in errs.items():
            rows.append({"kernel": name, "dtype": str(dtype).replace("torch.", ""), "max_abs_err": e,
                         "tol": tol[dtype], "ok": e <= tol[dtype]})
    return rows


def run_gpu(out_path: str) -> int:
    from minillm.kernels import kv_store, paged_decode, prefill, rmsnorm, rope
    from minillm.kernels._common import measure_roofs

    dev = "cuda"
    t0 = time.time()
    checks = check_all(dev)
    roofs = measure_roofs(dev)
    perf = [
        kv_store.perf_report(roofs=roofs),
        paged_decode.perf_report(batch=64, ctx=4096, roofs=roofs),
        paged_decode.perf_report(batch=4, ctx=4096, roofs=roofs),  # split-K case
        prefill.perf_report(seq_len=4096, roofs=roofs),
        rmsnorm.perf_report(roofs=roofs),
        rope.perf_report(roofs=roofs),
    ]
    for r in perf:
        if r["kernel"] in TARGETS and r["shape"]["B"] in (1, 64):
            key, goal = TARGETS[r["kernel"]]
            r["target"], r["meets_target"] = f"{key} >= {goal}", r.get(key, 0) >= goal

    print(f"device: {torch.cuda.get_device_name()}  copy {roofs['copy_GBps']:.0f} GB/s  "
          f"bf16 matmul {roofs['matmul_TFLOPs']:.0f} TFLOP/s")
    bad = [c for c in checks if not c["ok"]] + [r for r in perf if not r["ok"]]
    print(f"correctness: {len(checks) + len(perf) - len(bad)}/{len(checks) + len(perf)} ok" + "".join(
        f"\n  FAIL {c['kernel']} {c.get('dtype', '')} err {c['max_abs_err']:.3g}" for c in bad))
    print(f"{'kernel':14s} {'shape':34s} {'ms':>8s} {'rate':>14s} {'vs roof':>8s} {'vs SDPA':>8s} target")
    for r in perf:
        s = r["shape"]
        shape = f"B{s.get('B', s.get('T'))} L{s.get('ctx', s.get('L', '-'))} H{s.get('H', '-')}/{s['kvh']} D{s['D']}"
        rate = f"{r['GBps']:.0f} GB/s" if "GBps" in r else f"{r['TFLOPs']:.0f} TFLOP/s"
        roof = r.get("frac_of_copy_bw", r.get("frac_of_matmul_roof", float("nan")))
        met = {True: "met", False: "MISSED"}.get(r.get("meets_target"), "")
        print(f"{r['kernel']:14s} {shape:34s} {r['ms']:8.3f} {rate:>14s} {roof:8.1%} "
              f"{r.get('frac_of_sdpa', float('nan')):8.1%} {met}")
    report = {
        "machine": {"device": torch.cuda.get_device_name(), "host": platform.node()},
        "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__},
        "roofs": roofs, "checks": checks, "perf": perf, "seconds": time.time() - t0,
    }
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"wrote {out_path}")
    return 0 if not bad else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Check and time minillm's Triton kernels")
    ap.add_argument("--out", default="kernels_bench.json", help="JSON report path")
    args = ap.parse_args(argv)
    if torch.cuda.is_available():
        return run_gpu(args.out)
    print("no CUDA GPU: skipping the timings; tiny correctness check under the Triton interpreter")
    from minillm.kernels._common import interpreting

    if not interpreting():
        print("TRITON_INTERPRET=0 and no GPU: nothing to run")
        return 0
    rows = check_all("cpu", dtypes=(torch.float32, torch.bfloat16), small=True)
    for r in rows:
        print(f"  {r['kernel']:20s} {r['dtype']:9s} max abs err {r['max_abs_err']:.2e}  {'ok' if r['ok'] else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
