"""int8 x int8 GEMMs against float ones at the default model's shapes: ``python -m minillm.bench.int8_gemm``.

For every target linear of the model (qkv, o, gate_up, down: K x N) and every
row count M (1 = a decode step, 128..512 = a batched prefill chunk), one
thread by default:

- fp32: F.linear with the weight K-major, as ModelRunner lays float weights on CPU;
- bf16: the same in bfloat16 (the AVX-512 BF16 dot products where the CPU has them);
- int8 GEMM: torch._int_mm on int8 operands (oneDNN: AVX-512 VNNI where the CPU has it),
  int32 out -- the integer arithmetic alone;
- w8a8: W8A8Linear end to end (per-token int8 quantization of x, the GEMM, the float rescale);
- w8a16: QuantLinear int8 weight-only (aten._weight_int8pack_mm, bf16 activations), for contrast;
- fp8: FP8Linear as it runs on CPU (the e4m3 weight dequantized on every call, then float32).

Rates are 2 M K N / time (GFLOP/s or GOP/s); each is the best of `--repeats`
runs of at least `--min-time` seconds, so a busy shared machine reads low, not noisy.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
from torch.nn import functional as F

DEFAULT_ROWS = (1, 16, 128, 256, 512)
PATHS = ("fp32", "bf16", "int8_gemm", "w8a8", "w8a16", "fp8")


@dataclass
class GemmRow:
    layer: str
    k: int
    n: int
    m: int
    gflops: dict[str, float]  # path -> 2 M K N / s / 1e9


def _rate(fn: Callable[[], object], flops: float, repeats: int, min_time: float) -> float:
    fn()  # warm-up: oneDNN primitives, packing
    best = float("inf")
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        best = min(best, dt / n)
    return flops / best / 1e9


def shapes_of(model) -> list[tuple[str, int, int]]:
    """(name, K, N) of the first decoder layer's target linears (every layer has the same)."""
    from minillm.quant.targets import TARGETS

    layer = model.layers[0]
    return [(t.split(".")[-1], layer.get_submodule(t).in_features, layer.get_submodule(t).out_features)
            for t in TARGETS]


@torch.no_grad()
def measure(shapes: list[tuple[str, int, int]], rows=DEFAULT_ROWS, repeats: int = 3,
            min_time: float = 0.1, log=lambda s: None, paths: tuple[str, ...] = PATHS) -> list[GemmRow]:
    from minillm.quant.fp8 import FP8Linear
    from minillm.quant.linear import QuantLinear
    from minillm.quant.w8a8 import W8A8Linear

    g = torch.Generator().manual_seed(0)
    out = []
    for name, k, n in shapes:
        w = torch.randn(n, k, generator=g) * 0.05
        w_kmajor = w.t().contiguous().t()
        w_bf16 = w_kmajor.bfloat16()
        wq = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        w8a8 = W8A8Linear.from_float(w)
        w8a16 = QuantLinear.from_float(w, 8)
        w8a16.use_cpu_kernels()
        fp8 = FP8Linear.from_float(w)
        for m in rows:
            x = torch.randn(m, k, generator=g)
            xb = x.bfloat16()
            xq = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
            fl = 2.0 * m * k * n
            timed = {
                "fp32": lambda: F.linear(x, w_kmajor),
                "bf16": lambda: F.linear(xb, w_bf16),
                "int8_gemm": lambda: torch._int_mm(xq, wq.t()),
                "w8a8": lambda: w8a8(x),
                "w8a16": lambda: w8a16(x),
                "fp8": lambda: fp8(x),
            }
            row = GemmRow(name, k, n, m, {p: round(_rate(f, fl, repeats, min_time), 1)
                                          for p, f in timed.items() if p in paths})
            log(format_row(row))
            out.append(row)
    return out


HEADER = f"{'layer':8s} {'K':>5s} {'N':>5s} {'M':>4s} " + " ".join(f"{p:>10s}" for p in PATHS) + "   (GFLOP/s)"


def format_row(r: GemmRow) -> str:
    return f"{r.layer:8s} {r.k:5d} {r.n:5d} {r.m:4d} " + " ".join(
        f"{r.gflops[p]:10.1f}" if p in r.gflops else f"{'-':>10s}" for p in PATHS)


def gains(rows: list[GemmRow], path: str, over: str) -> list[float]:
    """path's rate over `over`'s, one per (layer, M) row: e.g. gains(rows, "w8a8", "bf16")."""
    return [r.gflops[path] / r.gflops[over] for r in rows]


def main(argv: list[str] | None = None) -> int:
    from minillm.bench.report import build_report, write_json
    from minillm.roofline.machine import machine_info

    p = argparse.ArgumentParser(prog="python -m minillm.bench.int8_gemm", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="whose linear shapes (default: the default model)")
    p.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)), help="comma list of M")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-time", type=float, default=0.1, help="seconds per timed run")
    p.add_argument("--json", default=None, metavar="PATH")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from minillm.loader import load_model

    shapes = shapes_of(load_model(a.model, dtype=torch.float32).model)
    rows = tuple(int(r) for r in a.rows.split(",") if r.strip())
    if not rows or min(rows) < 1:
        raise SystemExit("--rows must be positive integers")
    print(HEADER, flush=True)
    result = measure(shapes, rows, a.repeats, a.min_time, log=lambda s: print(s, flush=True))
    if a.json:
        write_json(build_report("int8_gemm", machine=machine_info("cpu"), threads=a.threads,
                                settings={"model": a.model or "default", "repeats": a.repeats, "min_time": a.min_time},
                                rows=[asdict(r) for r in result]), a.json)
        print(f"wrote {a.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
