"""The machine's two roofs, measured: memory bandwidth and matmul FLOP/s per dtype.

A roof is an upper bound: the best this machine was seen to do, so no step
can honestly sit above it. Hence:

- bandwidth: a step mostly *reads* (weights, the KV cache), so the roof is the
  faster of the probes over a tensor much larger than the last-level cache: a
  read-only sum, the engine's own one-row product over it (`engine_read_probe`:
  its prefetched stream out-read the sum), and a copy counting read + write
  bytes (STREAM's "copy"). On a 2-core VM the read probe ran at ~31 GB/s, the
  copy at ~24 GB/s.
- compute: the best of several GEMM shapes, not one big square: on that VM a
  2048^3 float32 matmul ran at ~45 GFLOP/s while the (512 x 576) @ (576 x 1536)
  products of a prefill ran at ~96, and a prefill step was plotted at 112% of
  a roof taken from the square alone. The shapes include the products a
  prefill step of the model runs, in the layout it runs them (`model_gemm_shapes`:
  SkinnyLinear's W @ x.T, a transposed right operand), in the model's dtype;
  `get_roofs(extra_shapes=...)` adds another model's to the cached roof.
- each shape is also multiplied by the engine's own kernels (the float32 tiled
  kernel on a CPU), and the faster counts: on a Zen 5, where MKL runs ~200
  GFLOP/s and the tiled kernel 360-440, torch's GEMM alone was no roof.
- each figure is the best of several repeats (a shared machine only ever
  slows a repeat down); every repeat and the median are kept.
- the thread count is part of the machine: roofs are measured with the
  current torch thread count and cached per thread count, so measure them in
  the process (and with the threads) of the run they judge.

Results are cached per machine in ~/.cache/minillm (override with
MINILLM_CACHE_DIR) since measuring takes several seconds.
"""
from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from minillm import envs
from minillm.roofline.machine import MachineInfo, machine_info
from minillm.roofline.machine_state import probe_machine_state, settle
from minillm.roofline.timing import median, time_repeats

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_COPY_BYTES = 512 * 2**20
# (m, k, n) for an (m x k) @ (k x n) product, both operands row-major, or (m, k, n, "nt") with the
# right operand the transpose of a row-major (n x k) matrix -- how the engine multiplies (x @ W.T, or
# SkinnyLinear's W @ x.T). Squares, and the products of a 512-token prefill step of the default model
# (SmolLM2-135M: hidden 576, q 576 + k, v 2 x 192, MLP 1536; model_gemm_shapes(cfg, 512) gives them,
# tests check they match). A GPU needs more work per launch.
MATMUL_SHAPES = {
    "cpu": [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (512, 576, 1536), (256, 1024, 4096),
            (960, 576, 512, "nt"), (576, 576, 512, "nt"), (3072, 576, 512, "nt"), (576, 1536, 512, "nt"),
            (512, 576, 960, "nt"), (512, 576, 576, "nt"), (512, 576, 3072, "nt"), (512, 1536, 576, "nt")],
    "cuda": [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096), (4096, 4096, 14336)],
}
CACHE_VERSION = 6  # 2: read-bandwidth roof, best of several GEMM shapes, best repeat; 3: + the engine's prefill
# products; 4: + the same as x @ W.T (an Intel CPU's prefill: models/skinny_linear.transposed_max_rows);
# 5: + the engine's own float32 kernel on each shape (engine_gemm_kernels); 6: + its one-row product as a
# read probe (engine_read_probe)


@dataclass
class Measurement:
    """A rate measured several times: every repeat plus the median we quote."""

    unit: str
    values: list[float]
    median: float
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, unit: str, values: list[float], **params: Any) -> "Measurement":
        return cls(unit, values, median(values), params)

    @property
    def best(self) -> float:
        """The fastest repeat: what the machine can do (other tenants only slow a repeat down)."""
        return max(self.values) if self.values else float("nan")


@dataclass
class Roofs:
    machine: dict[str, Any]
    bandwidth: Measurement  # the bandwidth roof: whichever of the two probes below moved bytes faster
    read_bandwidth: Measurement  # sum(): bytes read / s -- what decode mostly does
    copy_bandwidth: Measurement  # copy: (read + write) bytes / s, STREAM's "copy"
    matmul: dict[str, Measurement]  # dtype name -> FLOP/s of the best GEMM shape (params: every shape's best)
    measured_at: float
    cache_version: int = CACHE_VERSION
    machine_state: dict[str, Any] | None = None  # probes before / after: was another tenant busy?

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth.best

    def flops_per_s(self, dtype: str | torch.dtype) -> float:
        name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
        return self.matmul[name].best

    @property
    def threads(self) -> int | None:
        return self.machine.get("torch_threads")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Roofs":
        return cls(
            machine=d["machine"],
            bandwidth=Measurement(**d["bandwidth"]),
            read_bandwidth=Measurement(**d["read_bandwidth"]),
            copy_bandwidth=Measurement(**d["copy_bandwidth"]),
            matmul={k: Measurement(**v) for k, v in d["matmul"].items()},
            measured_at=d["measured_at"],
            cache_version=d.get("cache_version", 0),
            machine_state=d.get("machine_state"),
        )


def engine_read_probe(src: torch.Tensor) -> Callable[[], object] | None:
    """The engine's one-row float32 product over `src` viewed as a [rows, 512] weight (it reads every
    byte once, as batch-1 decode does), or None where that kernel does not run (a GPU, no compiler).
    A roof is the fastest read the machine was seen to do, and torch's sum is no upper bound for the
    engine's own stream: on a 2-vCPU Zen 5 it read 97-105 GB/s from the LM head in runs where a 512 MiB
    sum read 75-80 (minillm/cpu/kernels/skinny_f32.cpp, rows_stream)."""
    if src.device.type != "cpu" or src.dtype != torch.float32 or src.numel() < 512:
        return None
    from minillm.cpu.kernels import skinny_cpu

    if not skinny_cpu.available():
        return None
    weight = src[: src.numel() // 512 * 512].view(-1, 512)
    x = torch.ones(1, 512)
    return lambda: skinny_cpu.linear(x, weight)


def probe_buffer(n: int, device: torch.device) -> torch.Tensor:
    """n float32 ones (ones, not empty: every page touched first). On a CPU in 2 MB pages where the
    machine has them, as the engine keeps its weights (minillm/cpu/huge_pages.py): the roof a decode step is
    judged against is then read the same way the step reads."""
    if torch.device(device).type == "cpu":
        from minillm.cpu.huge_pages import huge_page_empty

        raw = huge_page_empty(n * 4)
        if raw is not None:
            return raw.view(torch.float32).fill_(1.0)
    return torch.ones(n, dtype=torch.float32, device=device)


def measure_bandwidth(device: torch.device, nbytes: int = DEFAULT_COPY_BYTES, repeats: int = 10) -> tuple[Measurement, Measurement]:
    """(copy bandwidth counting read + write, read-only bandwidth: the faster of a sum and the engine's
    one-row product, `engine_read_probe`; params["kernel"] says which)."""
    n = nbytes // 4
    src = probe_buffer(n, device)
    dst = torch.zeros_like(src)
    copy_t = time_repeats(lambda: dst.copy_(src), device, repeats)
    read_values, kernel = [n * 4 / t for t in time_repeats(lambda: src.sum(), device, repeats)], "sum"
    stream = engine_read_probe(src)
    if stream is not None:
        read_bytes = src.numel() // 512 * 512 * 4
        theirs = [read_bytes / t for t in time_repeats(stream, device, repeats)]
        if max(theirs) > max(read_values):
            read_values, kernel = theirs, "one-row product"
    copy = Measurement.of("B/s", [2 * n * 4 / t for t in copy_t], probe="copy", nbytes=n * 4, repeats=repeats)
    read = Measurement.of("B/s", read_values, probe="read", nbytes=n * 4, repeats=repeats, kernel=kernel)
    return copy, read


def bandwidth_roof(copy: Measurement, read: Measurement) -> Measurement:
    """The probe that moved bytes faster (its best repeat) is the roof."""
    return max((read, copy), key=lambda m: m.best)


def shape_key(shape: Sequence) -> str:
    """'MxKxN' (both operands row-major) or 'MxKxN-nt' (the right one transposed), as the roofs store it."""
    m, k, n, *layout = shape
    return f"{m}x{k}x{n}" + (f"-{layout[0]}" if layout and layout[0] != "nn" else "")


def model_gemm_shapes(cfg: Any, rows: int = 512) -> list[tuple[int, int, int, str]]:
    """The matmuls a prefill step of `rows` tokens runs through each layer of a dense model, as the
    engine computes them: SkinnyLinear's W @ x.T up to its transposed_max_rows() (W [out x in]; 32 on an
    Intel CPU), x @ W.T beyond -- both with a transposed right operand ("nt"). qkv_proj, o_proj,
    gate_up_proj, down_proj."""
    from minillm.cpu.skinny_linear import transposed_max_rows

    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    inter = cfg.intermediate_size
    out_in = [(q + 2 * kv, h), (h, q), (2 * inter, h), (h, inter)]
    if rows <= transposed_max_rows():
        return [(o, i, rows, "nt") for o, i in out_in]
    return [(rows, i, o, "nt") for o, i in out_in]


def measure_gemm(device: torch.device, dtype: torch.dtype, shape: Sequence, repeats: int,
                 kernel: str = "torch") -> list[float]:
    """FLOP/s of each repeat of an (m x k) @ (k x n) product; layout "nt": the (k x n) operand is the
    transpose of a row-major (n x k) matrix, as in x @ W.T. kernel "tiled": the engine's own float32
    kernel (minillm/cpu/kernels/tiled_cpu.py) multiplies the same operands, the right one as a row-major (n x k) W."""
    m, k, n, *layout = shape
    a = torch.randn(m, k, device=device).to(dtype)
    if kernel == "tiled":
        from minillm.cpu.kernels import tiled_cpu

        w = torch.randn(n, k, device=device).to(dtype)
        product = lambda: tiled_cpu.linear(a, w)  # noqa: E731
    else:
        b = torch.randn(n, k, device=device).to(dtype).t() if layout and layout[0] == "nt" else \
            torch.randn(k, n, device=device).to(dtype)
        out = torch.empty(m, n, device=device, dtype=dtype)
        product = lambda: torch.matmul(a, b, out=out)  # noqa: E731
    return [2 * m * k * n / t for t in time_repeats(product, device, repeats)]


def engine_gemm_kernels(device: torch.device, dtype: torch.dtype) -> list[str]:
    """The engine's own GEMM kernels for this device and dtype, measured beside torch's: a roof is the
    fastest product the machine was seen to run, and on a CPU where MKL does not run its best code (a
    Zen 5: ~200 GFLOP/s float32 where the tiled kernel ran 360-440) torch's GEMM alone put a batched run
    at 102% of its "roof"."""
    if device.type != "cpu" or dtype != torch.float32:
        return []
    from minillm.cpu.kernels import tiled_cpu

    return ["tiled"] if tiled_cpu.available() else []


def measure_matmul(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 5,
                   shapes: Sequence[Sequence] | None = None) -> Measurement:
    """The best GEMM shape's repeats, by torch's product and by each of the engine's own kernels
    (`engine_gemm_kernels`); `n`: one n x n square only, for quick tests. Each shape's figure is its
    fastest kernel's, and `kernels` says which kernel that was where it was not torch's."""
    if shapes is None:
        shapes = [(n, n, n)] if n else MATMUL_SHAPES.get(device.type, MATMUL_SHAPES["cpu"])
    per_shape: dict[tuple, list[float]] = {}
    kernel_of: dict[str, str] = {}
    own = engine_gemm_kernels(device, dtype)
    for shape in map(tuple, shapes):
        per_shape[shape] = measure_gemm(device, dtype, shape, repeats)
        for kernel in own:
            theirs = measure_gemm(device, dtype, shape, repeats, kernel=kernel)
            if max(theirs) > max(per_shape[shape]):
                per_shape[shape], kernel_of[shape_key(shape)] = theirs, kernel
    best = max(per_shape, key=lambda sh: max(per_shape[sh]))
    m, k, nn, *layout = best
    return Measurement.of("FLOP/s", per_shape[best], m=m, k=k, n=nn, layout=(layout or ["nn"])[0],
                          dtype=str(dtype).removeprefix("torch."), repeats=repeats,
                          kernel=kernel_of.get(shape_key(best), "torch"),
                          shapes={shape_key(sh): max(v) for sh, v in per_shape.items()}, kernels=kernel_of)


def add_shapes(mm: Measurement, device: torch.device, dtype: torch.dtype, shapes: Sequence[Sequence],
               repeats: int = 5) -> tuple[Measurement, bool]:
    """`mm` with the GEMM shapes it has not measured yet measured now; the roof stays the best shape's
    repeats. Returns (measurement, whether anything was measured)."""
    todo = [tuple(s) for s in shapes if shape_key(s) not in mm.params.get("shapes", {})]
    if not todo:
        return mm, False
    return merged_matmul(mm, measure_matmul(device, dtype, repeats=repeats, shapes=todo)), True


def merged_matmul(a: Measurement, b: Measurement) -> Measurement:
    """One matmul roof from two measurements of it: the faster one's repeats, and every GEMM shape
    either measured (a shape both measured keeps its faster figure)."""
    shapes, kernels = dict(a.params.get("shapes", {})), dict(a.params.get("kernels", {}))
    for key, flops in b.params.get("shapes", {}).items():
        if key not in shapes or flops > shapes[key]:
            shapes[key] = flops
            kernels.pop(key, None)
            if key in b.params.get("kernels", {}):
                kernels[key] = b.params["kernels"][key]
    top = b if b.best > a.best else a
    return Measurement(top.unit, top.values, top.median, {**top.params, "shapes": shapes, "kernels": kernels})


def measure_roofs(
    device: str | torch.device = "cpu",
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    copy_bytes: int = DEFAULT_COPY_BYTES,
    matmul_n: int | None = None,
    repeats: int = 10,
    wait_quiet_s: float = 0.0,
) -> Roofs:
    """Measure now. A roof taken while another tenant holds a core is too low: with wait_quiet_s
    we first wait for a quiet window, and the probes before and after are stored either way."""
    dev = torch.device(device)
    info = machine_info(dev)
    before = settle(wait_quiet_s) if dev.type == "cpu" else None
    copy, read = measure_bandwidth(dev, copy_bytes, repeats)
    mm = {name: measure_matmul(dev, DTYPES[name], matmul_n, max(3, repeats // 2)) for name in dtypes}
    after = probe_machine_state() if dev.type == "cpu" else None
    state = {"before": before.to_dict(), "after": after.to_dict()} if before and after else None
    return Roofs(machine=info.to_dict(), bandwidth=bandwidth_roof(copy, read), read_bandwidth=read,
                 copy_bandwidth=copy, matmul=mm, measured_at=time.time(), machine_state=state)


def best_of(cached: Roofs, fresh: Roofs) -> Roofs:
    """Each roof from whichever of two measurements on the same machine ran faster.

    A roof is an upper bound and another tenant can only slow a probe down, so a re-measure that
    came out lower (a busy minute) must not lower the roof: `--remeasure` can raise a roof, never
    drop it. Matmul shapes measured by either are all kept; measured_at and the probes are the
    fresh run's."""
    matmul = dict(cached.matmul)
    for name, mm in fresh.matmul.items():
        matmul[name] = merged_matmul(matmul[name], mm) if name in matmul else mm
    read = max((cached.read_bandwidth, fresh.read_bandwidth), key=lambda m: m.best)
    copy = max((cached.copy_bandwidth, fresh.copy_bandwidth), key=lambda m: m.best)
    return Roofs(machine=fresh.machine, bandwidth=bandwidth_roof(copy, read), read_bandwidth=read,
                 copy_bandwidth=copy, matmul=matmul, measured_at=fresh.measured_at,
                 machine_state=fresh.machine_state)


def cache_dir() -> Path:
    return Path(envs.cache_dir() or Path.home() / ".cache" / "minillm")


def cache_path(info: MachineInfo) -> Path:
    return cache_dir() / f"roofs-{info.cache_key()}.json"


BUSY_LOAD_PER_CPU = 2.0  # this process alone stays near 1 per CPU; 2 means another tenant as busy as we are


def measured_while_busy(roofs: Roofs) -> str | None:
    """Why a measurement should not be cached (parallel ops stalled before or after it, or more runnable
    work than CPUs), else None.

    The stall probe misses a tenant that keeps both cores busy between its probes: on the 2-core VM a
    benchmark at load 4.3 left the probe quiet (stall ratio 1.4) while the roofs came out at 173 GFLOP/s
    and 16.9 GB/s against 407 and 29 on the quiet machine -- and were cached. A 1-minute load average
    above `BUSY_LOAD_PER_CPU` x the CPUs says the same thing (this process alone, on all cores, stays
    at about 1 x)."""
    from minillm.roofline.machine_state import QUIET_STALL_RATIO

    cpus = (roofs.machine or {}).get("logical_cpus") or os.cpu_count() or 1
    for when, st in (roofs.machine_state or {}).items():
        ratio = st.get("stall_ratio")
        if ratio is not None and ratio > QUIET_STALL_RATIO:
            return f"{when}: parallel ops {ratio:.1f}x slower than serial, above {QUIET_STALL_RATIO}"
        load = (st.get("load_average") or [None])[0]
        if load is not None and load > BUSY_LOAD_PER_CPU * cpus:
            return f"{when}: load average {load:.1f} on {cpus} CPUs, above {BUSY_LOAD_PER_CPU:g} per CPU"
    return None


def get_roofs(
    device: str | torch.device = "cpu",
    remeasure: bool = False,
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    extra_shapes: Sequence[Sequence] = (),
    **measure_kw: Any,
) -> Roofs:
    """The cached roofs of this machine, measuring (and caching) them when absent or asked to.

    extra_shapes: GEMM shapes (e.g. `model_gemm_shapes(cfg)`: the products a prefill of the model
    being judged runs) the compute roof must include; any the cache lacks are measured and added."""
    dev = torch.device(device)
    path = cache_path(machine_info(dev))
    roofs = cached = None
    if path.exists():
        try:
            cached = Roofs.from_dict(json.loads(path.read_text()))
            if cached.cache_version != CACHE_VERSION:
                cached = None
        except (ValueError, KeyError, TypeError):  # a corrupt or old cache: measure again
            cached = None
    if not remeasure and cached is not None and all(d in cached.matmul for d in dtypes):
        roofs = cached
    fresh = roofs is None
    if fresh:
        roofs = measure_roofs(dev, dtypes, **measure_kw)
        if remeasure and cached is not None and not measured_while_busy(roofs):
            roofs = best_of(cached, roofs)  # a re-measure may raise a roof, never lower it
    if extra_shapes:
        before = probe_machine_state() if dev.type == "cpu" and not fresh else None
        added = False
        for name in dtypes:
            roofs.matmul[name], more = add_shapes(roofs.matmul[name], dev, DTYPES[name], extra_shapes)
            added = added or more
        if not fresh and not added:
            return roofs
        if before is not None:  # the probes around what was measured now
            roofs.machine_state = {"before": before.to_dict(), "after": probe_machine_state().to_dict()}
    elif not fresh:
        return roofs
    busy = measured_while_busy(roofs)
    if busy:  # a roof measured under another tenant's load is too low: use it now, never keep it
        warnings.warn(f"roofs measured while the machine was busy ({busy}); not cached, so the next run "
                      f"measures again (bench --wait-quiet waits for a quiet window)", stacklevel=2)
        return roofs
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(roofs.to_dict(), indent=2))
    tmp.replace(path)  # atomic: a concurrent reader never sees half a file
    return roofs
