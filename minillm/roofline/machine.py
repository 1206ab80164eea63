"""What machine and software a measurement was taken on.

Benchmarks are only comparable on the same machine and versions, so every
JSON report carries this record, and the roof cache is keyed by it.
"""
from __future__ import annotations

import hashlib
import os
import platform
import socket
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

import torch

from minillm import envs
from minillm.host import cpu_model_and_flags, meminfo_bytes


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class MachineInfo:
    hostname: str
    cpu_model: str
    cpu_flags: list[str]
    logical_cpus: int
    torch_threads: int
    memory_bytes: int | None
    device: str  # "cpu" or "cuda:0"
    device_name: str  # the GPU's name, or the CPU model
    versions: dict[str, str | None] = field(default_factory=dict)
    # which CPU kernels run: torch's (ATEN_CPU_CAPABILITY picks AVX2 on an AVX-512 machine) and the
    # GGUF block kernels' build (minillm/cpu/kernels/gguf_cpu.py; None until a model with quantization="gguf" loads)
    kernels: dict[str, str | None] = field(default_factory=dict)

    def cache_key(self) -> str:
        """Roofs change with the hardware, the thread count and torch's kernels, not with our code."""
        parts = [self.cpu_model, self.device_name, str(self.torch_threads), str(self.versions.get("torch"))]
        digest = hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]
        host = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.hostname) or "host"
        return f"{host}-{digest}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def machine_info(device: str | torch.device = "cpu") -> MachineInfo:
    dev = torch.device(device)
    cpu_model, flags = cpu_model_and_flags()
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        dev_name, dev_str = torch.cuda.get_device_name(index), f"cuda:{index}"
    else:
        dev_name, dev_str = cpu_model, "cpu"
    versions = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "minillm": _version("minillm"),
        "triton": _version("triton"),
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
    }
    return MachineInfo(
        hostname=socket.gethostname(),
        cpu_model=cpu_model,
        cpu_flags=flags,
        logical_cpus=os.cpu_count() or 1,
        torch_threads=torch.get_num_threads(),
        memory_bytes=meminfo_bytes("MemTotal"),
        device=dev_str,
        device_name=dev_name,
        versions=versions,
        kernels=cpu_kernels(),
    )


def cpu_kernels() -> dict[str, str | None]:
    """The CPU code paths this process uses, as detected at start-up."""
    from minillm.cpu.memory import malloc_state
    from minillm.cpu.huge_pages import huge_pages_state
    from minillm.cpu import compiled_body_layout
    from minillm.cpu.kernels import gguf_cpu, tiled_cpu
    from minillm.quant.cpu_route import cpu_features

    feats = cpu_features()
    # quant_cpu_route: what int8/int4 layers multiply with (minillm.quant.cpu_route); "blocks" may build the kernels
    route = envs.get(envs.MINILLM_QUANT_CPU_ROUTE) or "bf16"  # the default on every CPU (cpu_route.py says why)
    return {"torch_cpu_capability": feats.torch_capability, "gguf_blocks": gguf_cpu.loaded_isa(),
            "native_bf16": feats.native_bf16, "quant_cpu_route": route,
            "float32_batched_linear": tiled_cpu.loaded_isa(),  # None: MKL (not built yet, or MINILLM_TILED=mkl)
            "cpu_vendor": tiled_cpu.cpu_vendor(),
            "float32_batched_linear_rows": tiled_cpu.row_limits().why,  # where the tiled kernel beats MKL here
            "compiled_float32_body": compiled_body_layout(),
            "malloc": malloc_state(),  # glibc's thresholds as an engine set them (minillm/cpu/memory.py); None: untouched
            "huge_pages": huge_pages_state()}  # weights in 2 MB pages (minillm/cpu/huge_pages.py)
