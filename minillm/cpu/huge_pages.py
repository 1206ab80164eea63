"""Weights in 2 MB pages: fewer TLB misses while a CPU decode step streams every weight once.

A batch-1 decode step reads the whole model (the default model: 540 MB in float32) from
memory, one 4 KB page after another. Each page is a TLB entry; the CPU's TLBs hold a few
thousand, so nearly every page costs a page walk, and the walks sit in the way of the
stream. Linux's transparent huge pages back a region with 2 MB pages instead (512 times
fewer entries) where the region asks for them with `madvise(MADV_HUGEPAGE)` -- the
default policy, "madvise", on most distributions -- or everywhere ("always").

`move_to_huge_pages(model)` copies the model's CPU parameters and buffers into one
anonymous mapping that asks for huge pages before it is first touched, and points each
parameter at its copy (same values, shape, strides and Parameter objects; tied weights stay
tied). The engine does it once, after the weights took their final layout
(engine/model_runner.py). A compiled graph multiplies its own packed copies of the weights;
`collapse_into_huge_pages` turns their pages into huge pages where they lie (Linux 6.1's
MADV_COLLAPSE; engine/compile.frozen_compile). The read probes of the roofs use a huge-page
buffer too (`huge_page_empty`), so a fraction of the roof compares like with like.

Measured on a 2-vCPU AMD EPYC Zen 5, two threads, the same weights in 4 KB and in 2 MB pages,
alternated in one process (mostly a slow hour: probes 39-65 GB/s): the few-row kernel at one
row, the default model's 120 body linears 10.1 -> 9.9, 11.0 -> 10.6, 9.2 -> 8.8 ms and its LM
head 2.53 -> 2.40, 2.63 -> 2.55, 2.25 -> 2.00 ms (medians of 25-40); batch-1 decode, two
engines on two copies of the model, eager paired x1.07 and compiled x1.076.

MINILLM_HUGE_PAGES=0 leaves the weights where the loader put them. Elsewhere (not Linux,
transparent huge pages "never", a GPU) nothing moves; the report says why.
"""
from __future__ import annotations

import ctypes
import dataclasses
import errno
import mmap
import sys
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from minillm import envs
from minillm.cpu.memory import release_freed_memory

HUGE_PAGES_ENV = envs.MINILLM_HUGE_PAGES
HUGE_PAGE = 2 << 20
ALIGN = 4096  # each tensor starts on its own 4 KB page inside the mapping
MIN_BYTES = 64 << 10  # smaller tensors (norm weights, biases) stay where they are
RELEASE_EVERY = 512 << 20  # bytes moved between two hand-backs of the freed heap (move_to_huge_pages)
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
MADV_COLLAPSE = 25  # Linux 6.1+: collapse a range's pages into huge pages now, in place
_arenas: list[tuple[weakref.ref, int, int]] = []  # this process's mappings: (mmap, start, end), alive while used
_done = {"moved": 0, "moved_huge": 0, "collapsed": 0, "collapsed_huge": 0}  # bytes, this process (huge_pages_state)


def huge_pages_enabled() -> bool:
    """False where MINILLM_HUGE_PAGES=0 (the weights stay where the loader or inductor put them)."""
    return envs.huge_pages()


def thp_mode() -> str:
    """Linux's transparent huge page policy ("always", "madvise", "never"), or why there is none."""
    if sys.platform != "linux" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return "unavailable (not Linux)"
    try:
        text = open(THP_SETTING).read()
    except OSError:
        return f"unavailable (no {THP_SETTING})"
    chosen = [w[1:-1] for w in text.split() if w.startswith("[") and w.endswith("]")]
    return chosen[0] if chosen else f"unavailable ({THP_SETTING}: {text.strip()!r})"


def huge_page_empty(nbytes: int) -> torch.Tensor | None:
    """An untouched uint8 CPU tensor of `nbytes` at a 2 MB boundary of a mapping that asked for huge
    pages, or None where the machine has none. Its pages are allocated (as 2 MB pages where the kernel
    can) when first written: fill it before timing it."""
    if not thp_mode() in ("always", "madvise"):
        return None
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # keeps the mapping alive
    _arenas.append((weakref.ref(mapping), whole.data_ptr(), whole.data_ptr() + whole.numel()))
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start : start + nbytes]


def in_huge_page_mapping(t: torch.Tensor) -> bool:
    """Whether `t` already lives in a mapping huge_page_empty made (an engine built again on the same model)."""
    ptr = t.untyped_storage().data_ptr()
    return any(ref() is not None and lo <= ptr < hi for ref, lo, hi in _arenas)


def huge_page_bytes_in(ranges: list[tuple[int, int]]) -> int:
    """Bytes of the address ranges [lo, hi) that the kernel backs with huge pages now (/proc/self/smaps:
    AnonHugePages of each mapping, counted in proportion to its overlap with the ranges)."""
    total, overlap, span = 0, 0, 1
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(v, 16) for v in head.split("-"))
                    overlap = sum(max(0, min(hi, b) - max(lo, a)) for a, b in ranges)
                    span = hi - lo
                elif head == "AnonHugePages:" and overlap:
                    total += int(line.split()[1]) * 1024 * overlap // span
    except OSError:
        return 0
    return total


def collapse_into_huge_pages(tensors: Iterable[torch.Tensor]) -> HugePageReport:
    """Turn the pages under these CPU tensors (64 KB or more each) into 2 MB pages in place: Linux 6.1's
    MADV_COLLAPSE, which needs no new mapping, so nothing that holds their addresses notices. For weights
    the engine does not own, such as the packed copies a frozen compiled graph keeps
    (engine/compile.frozen_compile). Best effort: a kernel short of free 2 MB pages collapses fewer."""
    if not huge_pages_enabled():
        return HugePageReport(f"off ({HUGE_PAGES_ENV}=0)")
    extents = sorted({(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors
                      if t.device.type == "cpu" and t.layout == torch.strided
                      and t.numel() * t.element_size() >= MIN_BYTES})  # each tensor once
    if not extents or sys.platform != "linux":
        return HugePageReport(thp_mode())
    chunks_of = {(lo, hi): range(lo // HUGE_PAGE * HUGE_PAGE, hi, HUGE_PAGE) for lo, hi in extents}
    chunks = sorted({c for span in chunks_of.values() for c in span})
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = set()
    for chunk in chunks:  # one call per 2 MB: a chunk that fails stops no other
        if libc.madvise(chunk, HUGE_PAGE, MADV_COLLAPSE) == 0:
            done.add(chunk)
        elif ctypes.get_errno() == errno.EINVAL and not done:
            return HugePageReport("unavailable (MADV_COLLAPSE refused: Linux before 6.1, or memory it cannot collapse)")
        # ENOMEM (the chunk runs past its mapping) or EAGAIN (no free 2 MB page): that chunk stays as it was
    huge = sum(min(hi, c + HUGE_PAGE) - max(lo, c) for (lo, hi), span in chunks_of.items() for c in span if c in done)
    nbytes = sum(hi - lo for lo, hi in extents)
    _done["collapsed"] += nbytes
    _done["collapsed_huge"] += huge
    return HugePageReport(thp_mode(), len(extents), nbytes, huge, action="collapsed in place")


@dataclass
class HugePageReport:
    """What move_to_huge_pages or collapse_into_huge_pages did, for the runner and the bench JSON."""

    mode: str  # the kernel's policy, or why nothing moved
    tensors: int = 0  # tensors moved (each shared storage once) or collapsed
    bytes: int = 0  # their bytes
    huge_bytes: int = 0  # of those, backed by 2 MB pages right after the move
    already: int = 0  # bytes a previous move (an earlier engine on the same model) had put there
    action: str = "moved to a huge-page mapping"  # or "collapsed in place" (collapse_into_huge_pages)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        if not self.tensors:
            if self.already:
                return f"{self.already / 2**20:.0f} MiB of weights already in a huge-page mapping ({self.mode})"
            return f"weights in 4 KB pages ({self.mode})"
        return (f"{self.bytes / 2**20:.0f} MiB of weights {self.action}, "
                f"{self.huge_bytes / 2**20:.0f} MiB of it in 2 MB pages (transparent huge pages: {self.mode})")


def _movable(t: torch.Tensor) -> bool:
    """A dense CPU tensor that alone spans its whole storage (so a copy of the storage is a copy of it)."""
    return (t.device.type == "cpu" and t.layout == torch.strided and not t.is_quantized
            and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
            and t.untyped_storage().nbytes() >= MIN_BYTES)


def move_to_huge_pages(model: nn.Module) -> HugePageReport:
    """Copy `model`'s large CPU parameters and buffers into one huge-page mapping (module docstring)."""
    if not huge_pages_enabled():
        return HugePageReport(f"off ({HUGE_PAGES_ENV}=0)")
    mode = thp_mode()
    tensors: dict[int, torch.Tensor] = {}  # storage address -> one tensor on it
    already: dict[int, int] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type == "cpu" and in_huge_page_mapping(t):
            already[t.data_ptr()] = t.numel() * t.element_size()
        elif _movable(t):
            tensors.setdefault(t.untyped_storage().data_ptr(), t)
    if not tensors:
        return HugePageReport(mode, already=sum(already.values()))
    offsets, end = {}, 0
    for ptr, t in tensors.items():
        offsets[ptr] = end
        end += -(-t.untyped_storage().nbytes() // ALIGN) * ALIGN
    arena = huge_page_empty(end)
    if arena is None:
        return HugePageReport(mode, already=sum(already.values()))
    count, nbytes = len(tensors), sum(t.untyped_storage().nbytes() for t in tensors.values())
    # who points at each storage: its Parameters (tied weights: one object) and (module, name) buffer slots
    params: dict[int, list[nn.Parameter]] = {}
    for prm in model.parameters():
        if _movable(prm) and prm.untyped_storage().data_ptr() in tensors:
            params.setdefault(prm.untyped_storage().data_ptr(), []).append(prm)
    slots: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, b in module._buffers.items():
            if b is not None and _movable(b) and b.untyped_storage().data_ptr() in tensors:
                slots.setdefault(b.untyped_storage().data_ptr(), []).append((module, name))
    # one storage at a time, each old copy freed as soon as nothing points at it, and the freed heap handed
    # back every RELEASE_EVERY bytes: the move's peak is the model plus a little, not the model twice
    since_release = 0
    with torch.no_grad():
        for ptr in list(tensors):
            t = tensors.pop(ptr)
            n = t.untyped_storage().nbytes()
            flat = arena[offsets[ptr] : offsets[ptr] + n]
            flat.copy_(torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()))
            b = prm = None
            for prm in params.pop(ptr, []):
                prm.data = flat.view(prm.dtype).as_strided(prm.size(), prm.stride())
            for module, name in slots.pop(ptr, []):
                b = module._buffers[name]
                module._buffers[name] = flat.view(b.dtype).as_strided(b.size(), b.stride())
            t = b = prm = flat = None  # this loop's references to the old copy
            since_release += n
            if since_release >= RELEASE_EVERY:
                release_freed_memory()
                since_release = 0
    release_freed_memory()
    report = HugePageReport(mode, count, nbytes, huge_page_bytes_in([(arena.data_ptr(), arena.data_ptr() + end)]), sum(already.values()))
    _done["moved"] += report.bytes
    _done["moved_huge"] += report.huge_bytes
    return report


def huge_pages_state() -> str:
    """For the bench JSON: the kernel's policy and what this process's engines put in 2 MB pages so far."""
    if not huge_pages_enabled():
        return f"off ({HUGE_PAGES_ENV}=0)"
    mib = {k: v / 2**20 for k, v in _done.items()}
    return (f"transparent huge pages: {thp_mode()}; this process: {mib['moved']:.0f} MiB of weights moved "
            f"({mib['moved_huge']:.0f} in 2 MB pages), {mib['collapsed']:.0f} MiB of compiled graphs' weights "
            f"collapsed ({mib['collapsed_huge']:.0f} in 2 MB pages)")
