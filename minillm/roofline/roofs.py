"""The machine's two roofs, measured: memory bandwidth and matmul FLOP/s per dtype.

Bandwidth is a large tensor copy (much larger than the last-level cache),
counting the bytes read plus the bytes written, as STREAM's "copy" does.
Compute is a large square matmul (2 n^3 FLOPs) per dtype. Each figure is the
median of several repeats because shared machines drift. Results are cached
per machine in ~/.cache/minillm (override with MINILLM_CACHE_DIR) since
measuring takes several seconds.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from minillm.roofline.machine import MachineInfo, machine_info
from minillm.roofline.machine_state import probe_machine_state, settle
from minillm.roofline.timing import median, time_repeats

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_COPY_BYTES = 512 * 2**20
# CPU: n=2048 is ~17 GFLOP, a few tens of ms on a laptop core pair; GPU needs more work per launch.
DEFAULT_MATMUL_N = {"cpu": 2048, "cuda": 8192}
CACHE_VERSION = 1


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


@dataclass
class Roofs:
    machine: dict[str, Any]
    bandwidth: Measurement  # copy: (read + write) bytes / s -- the roof
    read_bandwidth: Measurement  # sum(): bytes read / s -- closer to what decode does, for reference
    matmul: dict[str, Measurement]  # dtype name -> FLOP/s
    measured_at: float
    cache_version: int = CACHE_VERSION
    machine_state: dict[str, Any] | None = None  # probes before / after: was another tenant busy?

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth.median

    def flops_per_s(self, dtype: str | torch.dtype) -> float:
        name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
        return self.matmul[name].median

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Roofs":
        return cls(
            machine=d["machine"],
            bandwidth=Measurement(**d["bandwidth"]),
            read_bandwidth=Measurement(**d["read_bandwidth"]),
            matmul={k: Measurement(**v) for k, v in d["matmul"].items()},
            measured_at=d["measured_at"],
            cache_version=d.get("cache_version", 0),
            machine_state=d.get("machine_state"),
        )


def measure_bandwidth(device: torch.device, nbytes: int = DEFAULT_COPY_BYTES, repeats: int = 10) -> tuple[Measurement, Measurement]:
    """(copy bandwidth counting read + write, read-only bandwidth of a sum)."""
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)  # ones, not empty: touch every page first
    dst = torch.zeros_like(src)
    copy_t = time_repeats(lambda: dst.copy_(src), device, repeats)
    read_t = time_repeats(lambda: src.sum(), device, repeats)
    copy = Measurement.of("B/s", [2 * n * 4 / t for t in copy_t], nbytes=n * 4, repeats=repeats)
    read = Measurement.of("B/s", [n * 4 / t for t in read_t], nbytes=n * 4, repeats=repeats)
    return copy, read


def measure_matmul(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 5) -> Measurement:
    n = n or DEFAULT_MATMUL_N.get(device.type, 2048)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    times = time_repeats(lambda: torch.matmul(a, b, out=out), device, repeats)
    return Measurement.of("FLOP/s", [2 * n**3 / t for t in times], n=n, dtype=str(dtype).removeprefix("torch."), repeats=repeats)


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
    return Roofs(machine=info.to_dict(), bandwidth=copy, read_bandwidth=read, matmul=mm, measured_at=time.time(),
                 machine_state=state)


def cache_dir() -> Path:
    return Path(os.environ.get("MINILLM_CACHE_DIR") or Path.home() / ".cache" / "minillm")


def cache_path(info: MachineInfo) -> Path:
    return cache_dir() / f"roofs-{info.cache_key()}.json"


def get_roofs(
    device: str | torch.device = "cpu",
    remeasure: bool = False,
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    **measure_kw: Any,
) -> Roofs:
    """The cached roofs of this machine, measuring (and caching) them when absent or asked to."""
    dev = torch.device(device)
    path = cache_path(machine_info(dev))
    if not remeasure and path.exists():
        try:
            roofs = Roofs.from_dict(json.loads(path.read_text()))
            if roofs.cache_version == CACHE_VERSION and all(d in roofs.matmul for d in dtypes):
                return roofs
        except (ValueError, KeyError, TypeError):  # a corrupt or old cache: measure again
            pass
    roofs = measure_roofs(dev, dtypes, **measure_kw)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(roofs.to_dict(), indent=2))
    tmp.replace(path)  # atomic: a concurrent reader never sees half a file
    return roofs
