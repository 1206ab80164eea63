"""Keep freed memory for the next step: glibc's malloc settings for inference on a CPU.

A prefill step allocates activations of several MB: the default model at 2,048 tokens
holds 2,048 x 3,072 floats (25 MB) after the MLP's gate/up product. glibc serves a
request above its mmap threshold (128 KB at start; raised as such blocks are freed,
up to 32 MB) with a fresh mapping, and unmaps it on free. The next step's tensor of
the same size then faults in every 4 KB page again, each zero-filled by the kernel.
A GPU engine never sees this (PyTorch's caching allocator keeps freed blocks); on a
CPU, vLLM's and Intel's guides preload tcmalloc or jemalloc for the same reason.

`keep_freed_memory()` does it in-process with `mallopt`: requests up to
MMAP_THRESHOLD come from the heap, and free memory at the heap's top is handed back
to the kernel only past TRIM_THRESHOLD. The process's resident memory then stays at
its peak, as it would with a caching allocator.

Measured on a 2-vCPU AMD EPYC Zen 5, float32 [2,048, 576]: `r + x.contiguous()`
3.5 -> 0.49 ms. The throughput workload's 128 prompts, prefill only
(`max_tokens=1`), 2 threads, three processes each way, alternating: 13.3-15.4 s
before, 11.4-12.7 s after (one "before" process ran at 12 s: glibc's own raised
threshold sometimes gets there by itself).

MINILLM_MALLOC=system leaves glibc's settings alone. Elsewhere (macOS, musl,
Windows) nothing changes.
"""
from __future__ import annotations

import ctypes
import functools
import platform
import sys

from minillm import envs

MALLOC_ENV = envs.MINILLM_MALLOC
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 << 20  # above a step's activations; a KV pool still gets its own mapping
TRIM_THRESHOLD = 1 << 30


@functools.cache
def keep_freed_memory() -> str:
    """Set glibc's mmap and trim thresholds once per process; returns what was done, for the bench JSON."""
    if envs.malloc_system():
        return f"system ({MALLOC_ENV}=system)"
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return "system (not glibc)"
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError as err:
        return f"system (libc.so.6: {err})"
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        return "system (mallopt refused)"
    return f"glibc: mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim threshold {TRIM_THRESHOLD >> 20} MiB"


def malloc_state() -> str | None:
    """What keep_freed_memory did in this process, or None if it has not run."""
    return keep_freed_memory() if keep_freed_memory.cache_info().currsize else None


def release_freed_memory() -> bool:
    """Hand the heap's free pages back to the kernel now (glibc's malloc_trim(0)); True if any went back.

    keep_freed_memory keeps freed memory for the next step, which suits a step's activations and not a
    one-off free: a model's weights after minillm/cpu/huge_pages.py copied them into 2 MB pages stayed
    resident as heap holes, so a CPU engine held its weights twice (the default model's engine 1,742 ->
    1,323 MB after a trim; a float32 1.5B model ~6 GB more, which ran a CI worker out of memory).
    ModelRunner calls it once its weights are in their final place."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return libc.malloc_trim(0) == 1
