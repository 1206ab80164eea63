"""Compile every kernel for NVIDIA GPU targets on a machine without a GPU.

``python -m minillm.kernels.compile_check [--arch 80 90] [--all-configs] [--json PATH]``
must run *without* ``TRITON_INTERPRET`` (under the interpreter ``triton.jit``
returns interpreter objects that cannot be compiled). It compiles each kernel
through ttir -> ttgir -> llir -> ptx and, when ``ptxas`` is available, cubin,
and checks the shared memory each needs against the target's limit. This is
what catches ``tl.dot`` shape minimums and layout problems the interpreter
does not enforce.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

# opt-in shared memory per block (bytes): A100 (sm80) 163 KiB, H100/H200 (sm90) 227 KiB
SMEM_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}


def specs(all_configs: bool = False) -> list[tuple]:
    from minillm.kernels import kv_store, paged_decode, prefill, quant_matmul, rmsnorm, rope

    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        out += [(dtype, *s) for s in kv_store.gpu_compile_specs(dtype)]
        out += [(dtype, *s) for s in rmsnorm.gpu_compile_specs(dtype) + rope.gpu_compile_specs(dtype)]
        if dtype != torch.float32:  # weight-only quant matmul: fp16/bf16 activations
            out += [(dtype, *s) for s in quant_matmul.gpu_compile_specs(dtype)]
        # big-model shape (bf16 only unless --all-configs: fp32 dots compile slowly and are not
        # the fast path) and the default SmolLM2 shape (head_dim 64, 9 q / 3 kv heads)
        shapes = ((128, 4), (64, 3)) if (dtype == torch.bfloat16 or all_configs) else ((64, 3),)
        for hd, group in shapes:
            out += [(dtype, *s) for s in paged_decode.gpu_compile_specs(dtype, head_dim=hd, group=group)]
            cfgs = prefill.all_gpu_configs() if (all_configs and dtype == torch.bfloat16 and hd == 128) else None
            out += [(dtype, *s) for s in prefill.gpu_compile_specs(dtype, head_dim=hd, group=group, configs=cfgs)]
    # the sliding-window prefill (Gemma 3's local layers): its extra key phase, once, bf16 big-model shape
    out += [(torch.bfloat16, *s) for s in prefill.gpu_compile_specs(torch.bfloat16, quant=0, windowed=True)]
    # tree verification (speculative decoding with a token tree): the mask-row loads, default model shape
    out += [(torch.bfloat16, *s) for s in prefill.gpu_compile_specs(torch.bfloat16, head_dim=64, group=3, quant=0,
                                                                     tree=True)]
    if all_configs:
        for c in paged_decode.GPU_CONFIGS:
            cfg = {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}
            out += [(torch.bfloat16, *s) for s in paged_decode.gpu_compile_specs(torch.bfloat16, config=cfg)][:1]
    return out


def run(archs: list[int], all_configs: bool = False) -> list[dict]:
    from minillm.kernels._common import gpu_compile

    rows = []
    for arch in archs:
        for dtype, name, fn, sig, opts in specs(all_configs):
            t0 = time.perf_counter()
            row = {"arch": arch, "kernel": name, "dtype": str(dtype).replace("torch.", ""), **opts}
            try:
                k = gpu_compile(fn, sig, arch, **opts)
                stages = [s for s in ("ttir", "ttgir", "llir", "ptx", "cubin") if s in k.asm]
                row.update(ok=True, stage=stages[-1], shared=k.metadata.shared,
                           fits_smem=k.metadata.shared <= SMEM_LIMIT.get(arch, 99 * 1024))
                row["ok"] = row["fits_smem"]
            except Exception as e:  # report every failure, not just the first
                row.update(ok=False, error=f"{type(e).__name__}: {str(e)[-400:]}")
            row["seconds"] = round(time.perf_counter() - t0, 2)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="+", default=[80, 90])
    ap.add_argument("--all-configs", action="store_true", help="also every autotune config (slower)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    rows = run(args.arch, args.all_configs)
    for r in rows:
        status = f"{r['stage']:5s} smem {r['shared'] // 1024:3d} KiB" if r["ok"] else "FAIL " + r.get("error", "smem")
        print(f"sm{r['arch']} {r['dtype']:8s} {r['kernel']:40s} {status}  ({r['seconds']}s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
