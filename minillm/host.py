"""What this machine's CPU and memory report (Linux's /proc; empty or None elsewhere).

A bottom layer: kernels and claims choose by these facts (quant/w8a8.py, cpu/panels.py), and the
benchmarks record them with every measurement (roofline/machine.py). Nothing of minillm is imported.
"""
from __future__ import annotations

import platform

INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx_vnni_int8", "amx_bf16",
                     "amx_tile", "amx_int8")


def cpu_model_and_flags() -> tuple[str, list[str]]:
    """The CPU's model name and which of INTERESTING_FLAGS it has (in that order)."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("", platform.processor(), platform.machine()):
                    model = value.strip()
                elif key == "flags" and not flags:
                    have = set(value.split())
                    flags = [fl for fl in INTERESTING_FLAGS if fl in have]
    except OSError:  # not Linux: keep what platform says
        pass
    return model, flags


def cpu_flags() -> set[str]:
    """The CPU features that choose kernels and claims here (bf16, int8 dot products, AMX); empty off Linux."""
    return set(cpu_model_and_flags()[1])


def meminfo_bytes(field: str) -> int | None:
    """A /proc/meminfo field ("MemTotal", "MemAvailable") in bytes, or None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
