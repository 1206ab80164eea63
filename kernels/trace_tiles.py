"""Watch the attention kernels work, one tile at a time (a recorder for the Triton interpreter).

How it works
------------
Under ``TRITON_INTERPRET=1`` a ``@triton.jit`` kernel is ordinary Python: the
interpreter recompiles the kernel's own source (same file, same line numbers,
assignments wrapped so constants become tensors) and calls it once per program
of the grid, with a numpy array behind every ``tl.tensor``. So Python's tracing
hook -- ``sys.settrace``, the mechanism debuggers use -- can pause the real
kernel at any line and read its local variables.

This module does exactly that for the decode and prefill kernels. The kernels
are not modified and nothing is re-implemented: the recorder waits for the line
``for n0 in range(...)`` of the key loop, which Python revisits after every
iteration, and copies the loop's state from the kernel's frame at that moment:

* which keys the tile covered (``pos``), which of them were loaded, and the
  physical block of the pool each one came from (``blk``, read from the block
  table inside the kernel);
* the masked score tile ``s`` (already multiplied by ``scale * log2 e``: the
  kernels use ``exp2``, so ``m`` is in base-2 units);
* the running max ``m_i``, running sum ``l_i`` and the rescale factor
  ``alpha`` of the online softmax after the tile.

For split-K decode it also records the combine kernel's locals when it
returns: each split's ``(m, l)`` and the weights ``w = 2^(m - M)``.

``trace_paged_decode`` and ``trace_prefill`` call the public wrappers
(``paged_decode_attention[_split]``, ``prefill_attention``) with the tile sizes
fixed to small values so that short sequences still take several tiles; the
interpreter otherwise uses one big tile (its cost grows with loop iterations).

The natural-log logsumexp of a row is ``ln 2 * (m + log2 l)``: the tests check
it against ``decode_logsumexp_ref`` / ``prefill_logsumexp_ref``, and check that
each program's recorded block ids are its sequence's block-table entries.

At the end: ``tile_view`` / ``tile_figure`` draw a trace with plotly (imported
on first use) -- the score matrix filled in tile by tile, the KV pool with the
blocks each tile read, and the running max and sum. A live version is a
FigureWidget synced from ``tile_figure`` (``minillm.visualize.widgets``).

Requires the interpreter: on a GPU the kernels are compiled, nothing runs as
Python, and these functions raise.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from minillm.kernels import paged_decode as _pd
from minillm.kernels import prefill as _pf
from minillm.kernels._common import LOG2E, interpreting, next_pow2

LN2 = math.log(2.0)


# ---------------------------------------------------------------- records
@dataclass
class TileStep:
    """One iteration of a program's key loop, as the kernel left it."""

    order: int  # position in the whole run (the interpreter runs programs one after another)
    program: int  # index into KernelTrace.programs
    tile: int  # k-th key tile of that program
    key_start: int  # n0: first key position of the tile
    key_pos: np.ndarray  # [BLOCK_N] key positions of the tile
    loaded: np.ndarray  # bool [BLOCK_N]: keys whose K/V rows were read from the pool
    block_ids: np.ndarray  # [BLOCK_N] pool block each key was read from; -1 where not loaded
    offsets: np.ndarray  # [BLOCK_N] slot inside that block (pos % block_size)
    scores: np.ndarray  # [rows, BLOCK_N] scores in log2 units (s * scale * log2 e); -inf where masked
    m: np.ndarray  # [rows] running max after this tile (log2 units)
    l: np.ndarray  # [rows] running sum after this tile
    alpha: np.ndarray  # [rows] 2^(m_old - m_new): how much the old sum and acc were scaled down
    causal: bool  # prefill: tile ran in the causally masked phase (decode: False)

    @property
    def blocks(self) -> list[int]:
        """Distinct pool blocks this tile read, in key order."""
        return _distinct(self.block_ids[self.loaded].tolist())

    @property
    def visible(self) -> np.ndarray:
        """bool [rows, BLOCK_N]: scores that took part (not masked)."""
        return np.isfinite(self.scores)


@dataclass
class ProgramTrace:
    """One program of the grid: a tile of query rows and the key tiles it walked."""

    kernel: str  # "paged_decode" | "prefill"
    program_id: tuple[int, int, int]  # tl.program_id(0..2) as launched
    seq: int  # sequence index in the batch (block-table row)
    kv_head: int
    heads: tuple[int, ...]  # query heads of the rows (decode: the GQA group; prefill: one head)
    split: int  # decode split-K: which key range; else 0
    q_tile: int  # prefill: which tile of BLOCK_M queries; decode: 0
    row_tokens: np.ndarray  # [rows] packed token index of each row's query
    row_positions: np.ndarray  # [rows] absolute position of each row's query in its sequence
    row_labels: list[str]
    key_range: tuple[int, int]  # keys [lo, hi) the program was responsible for
    num_splits: int = 1  # decode split-K: how many ranges each sequence's keys were cut into
    steps: list[TileStep] = field(default_factory=list)

    @property
    def m(self) -> np.ndarray:
        """Final running max (log2 units); -inf for a program that saw no keys (an empty split)."""
        return self.steps[-1].m if self.steps else np.full(len(self.row_labels), -np.inf, np.float32)

    @property
    def l(self) -> np.ndarray:
        return self.steps[-1].l if self.steps else np.zeros(len(self.row_labels), np.float32)

    def logsumexp(self) -> np.ndarray:
        """Natural-log logsumexp of each row's scaled scores over the keys this program saw."""
        with np.errstate(divide="ignore"):
            return LN2 * (self.m.astype(np.float64) + np.log2(self.l.astype(np.float64)))

    @property
    def blocks_read(self) -> list[int]:
        """Distinct pool blocks read, in the order the program first touched them."""
        return _distinct([b for st in self.steps for b in st.blocks])

    @property
    def keys_loaded(self) -> int:
        return int(sum(st.loaded.sum() for st in self.steps))

    @property
    def title(self) -> str:
        if self.kernel == "paged_decode":
            s = f", split {self.split} of {self.num_splits}" if self.num_splits > 1 else ""
            return f"seq {self.seq}, kv head {self.kv_head}{s}"
        return f"seq {self.seq}, head {self.heads[0]}, query tile {self.q_tile}"


@dataclass
class CombineRecord:
    """The split-K combine kernel for one (sequence, query head), read when it returned."""

    seq: int
    head: int
    m: np.ndarray  # [splits] each split's running max (log2 units)
    l: np.ndarray  # [splits] each split's running sum
    m_all: float  # M = max_s m_s
    weights: np.ndarray  # [splits] w_s = 2^(m_s - M)
    denom: float  # sum_s w_s l_s

    def logsumexp(self) -> float:
        return LN2 * (float(self.m_all) + math.log2(float(self.denom)))


@dataclass
class KernelTrace:
    kernel: str
    out: torch.Tensor  # what the kernel wrote
    block_m: int  # rows of a query tile (decode: the padded GQA group)
    block_n: int  # keys per K/V tile
    page: int  # tokens per cache block
    num_blocks: int  # size of the pool
    qk_scale: float  # scale * log2(e)
    num_splits: int
    seq_lens: list[int]
    block_tables: list[list[int]]  # each sequence's blocks (only those its keys use)
    programs: list[ProgramTrace]
    steps: list[TileStep]  # every tile of every program, in execution order
    combine: list[CombineRecord] = field(default_factory=list)

    def programs_of(self, seq: int, head: int | None = None) -> list[ProgramTrace]:
        """The programs that worked on sequence ``seq`` (and query head ``head``), in launch order."""
        return [p for p in self.programs if p.seq == seq and (head is None or head in p.heads)]

    def logsumexp(self) -> torch.Tensor:
        """Per query row and head, natural-log logsumexp: decode [B, H], prefill [T, H].

        Assembled from the programs' final (m, l), or from the combine kernel
        for split-K. Rows no program computed stay NaN.
        """
        T, H = self.out.shape[0], self.out.shape[1]
        lse = torch.full((T, H), float("nan"), dtype=torch.float64)
        if self.combine:
            for c in self.combine:
                lse[c.seq, c.head] = c.logsumexp()
            return lse
        for p in self.programs:
            vals = torch.from_numpy(p.logsumexp())
            if self.kernel == "paged_decode":
                lse[p.seq, list(p.heads)] = vals
            else:
                lse[torch.from_numpy(p.row_tokens.astype(np.int64)), p.heads[0]] = vals
        return lse

    def kv_bytes_loaded(self, head_dim: int, elem_size: int) -> int:
        """Bytes of K and V the programs read from the pool (each loaded key: a K row and a V row)."""
        return sum(2 * p.keys_loaded * head_dim * elem_size for p in self.programs)

    def useful_flops(self, head_dim: int) -> int:
        """2 FLOPs per multiply-add of Q K^T and of P V, counted over the unmasked scores only."""
        return sum(4 * int(st.visible.sum()) * head_dim for st in self.steps)


def _distinct(xs) -> list[int]:
    seen: dict[int, None] = {}
    for x in xs:
        seen.setdefault(int(x), None)
    return list(seen)


def _np(x: Any) -> np.ndarray:
    """A kernel local (interpreter tl.tensor, constexpr or Python number) as a fresh numpy array."""
    h = getattr(x, "handle", None)
    if h is not None and hasattr(h, "data"):
        return np.array(h.data, copy=True)
    return np.array(getattr(x, "value", x), copy=True)


def _int(x: Any) -> int:
    return int(_np(x).reshape(-1)[0])


def _float(x: Any) -> float:
    return float(_np(x).reshape(-1)[0])


# ---------------------------------------------------------------- the recorder
def _loop_line(fn, text: str = "for n0 in range(") -> tuple[str, int]:
    """(file, line number) of the key loop in a jit kernel's source."""
    py = fn.fn
    lines, first = inspect.getsourcelines(py)
    for i, line in enumerate(lines):
        if line.strip().startswith(text):
            return inspect.getsourcefile(py), first + i
    raise RuntimeError(f"no line starting with {text!r} in {py.__name__}: the recorder needs the key loop")


@contextlib.contextmanager
def _tracing(handlers: dict[str, Any], filenames: set[str]) -> Iterator[None]:
    """sys.settrace for the frames whose code name is in ``handlers`` (and whose file is a kernel file)."""

    def global_tracer(frame, event, arg):
        h = handlers.get(frame.f_code.co_name)
        if h is None or frame.f_code.co_filename not in filenames:
            return None
        return h(frame, event, arg)

    previous = sys.gettrace()
    sys.settrace(global_tracer)
    try:
        yield
    finally:
        sys.settrace(previous)


@contextlib.contextmanager
def _fixed_tiles(module, launcher) -> Iterator[None]:
    """Swap a kernel module's launcher (the one thing choosing tile sizes) for the length of a run."""
    original = module.kernel_launcher
    module.kernel_launcher = launcher
    try:
        yield
    finally:
        module.kernel_launcher = original


def _require_interpreter() -> None:
    if not interpreting():
        raise RuntimeError("tracing tiles needs the Triton interpreter: set TRITON_INTERPRET=1 before "
                           "minillm.kernels (or triton) is first imported")


def _check_tile(name: str, n: int) -> int:
    if n < 16 or n & (n - 1):
        raise ValueError(f"{name} must be a power of two >= 16 (what tl.arange and a GPU's tl.dot accept), got {n}")
    return n


class _Recorder:
    def __init__(self, kernel: str):
        self.kernel = kernel
        self.programs: list[ProgramTrace] = []
        self.steps: list[TileStep] = []
        self.combine: list[CombineRecord] = []
        self.current: ProgramTrace | None = None
        self.rows_ok: np.ndarray | None = None

    def add_step(self, L: dict, causal: bool) -> None:
        p = self.current
        pos = _np(L["pos"]).astype(np.int64)
        if "valid" in L:  # decode: keys of [start, end)
            loaded = _np(L["valid"]).astype(bool)
        elif causal:  # prefill, masked phase: keys < seq_len
            loaded = _np(L["k_ok"]).astype(bool)
        else:  # prefill, full tiles: every key is loaded
            loaded = np.ones_like(pos, dtype=bool)
        blk = _np(L["blk"]).astype(np.int64)
        page = _int(L["PAGE"])
        ok = self.rows_ok
        st = TileStep(
            order=len(self.steps), program=len(self.programs) - 1, tile=len(p.steps), key_start=int(L["n0"]),
            key_pos=pos, loaded=loaded, block_ids=np.where(loaded, blk, -1), offsets=pos % page,
            scores=_np(L["s"])[ok].astype(np.float32), m=_np(L["m_i"])[ok], l=_np(L["l_i"])[ok],
            alpha=_np(L["alpha"])[ok], causal=causal,
        )
        p.steps.append(st)
        self.steps.append(st)

    # decode ------------------------------------------------------------
    def decode_handler(self, loop_line: int):
        def local(frame, event, arg):
            if event == "call":
                self.current = None
            elif event == "line" and frame.f_lineno == loop_line:
                L = frame.f_locals
                if self.current is None:
                    self.start_decode_program(L)
                if "n0" in L:  # not on the first visit: n0 is the tile just finished
                    self.add_step(L, causal=False)
            return local

        return local

    def start_decode_program(self, L: dict) -> None:
        b, kvh, split = _int(L["b"]), _int(L["kvh"]), _int(L["split"])
        group = _int(L["GROUP"])
        self.rows_ok = _np(L["g_ok"]).astype(bool)
        heads = tuple(kvh * group + g for g in range(group))
        pos = _int(L["seq_len"]) - 1
        self.current = ProgramTrace(
            "paged_decode", (b, kvh, split), seq=b, kv_head=kvh, heads=heads, split=split, q_tile=0,
            row_tokens=np.full(group, b), row_positions=np.full(group, pos),
            row_labels=[f"head {h}" for h in heads], key_range=(_int(L["start"]), _int(L["end"])),
            num_splits=_int(L["NUM_SPLITS"]),
        )
        self.programs.append(self.current)

    def combine_handler(self):
        def local(frame, event, arg):
            if event == "return":
                L = frame.f_locals
                n = _int(L["NUM_SPLITS"])
                self.combine.append(CombineRecord(
                    seq=_int(L["b"]), head=_int(L["h"]), m=_np(L["m"])[:n], l=_np(L["l"])[:n],
                    m_all=_float(L["m_all"]), weights=_np(L["w"])[:n], denom=_float(L["denom"])))
            return local

        return local

    # prefill -------------------------------------------------------------
    def prefill_kernel_handler(self):
        def local(frame, event, arg):
            if event == "call":
                self.current = None  # a new program; it becomes a record once it reaches the key loop
            return None  # no line events needed inside the kernel itself

        return local

    def attend_handler(self, loop_line: int):
        def local(frame, event, arg):
            if event == "line" and frame.f_lineno == loop_line:
                L = frame.f_locals
                if self.current is None:
                    self.start_prefill_program(frame)
                if "n0" in L:
                    self.add_step(L, causal=bool(_int(L["MASKED"])))
            return local

        return local

    def start_prefill_program(self, frame) -> None:
        k = frame.f_back
        while k is not None and k.f_code.co_name != "prefill_kernel":
            k = k.f_back
        if k is None:
            raise RuntimeError("attend_tiles ran outside prefill_kernel: the recorder cannot name its program")
        K = k.f_locals
        h, seq, tile = _int(K["h"]), _int(K["seq"]), _int(K["tile"])
        group = _int(K["GROUP"])
        self.rows_ok = _np(K["m_ok"]).astype(bool)
        rows = _np(K["m"])[self.rows_ok]
        q_start, ctx = _int(K["q_start"]), _int(K["ctx"])
        pid = (h, _int(K["n_tiles"]) - 1 - tile, seq - _int(K["first_seq"]))  # the kernel launches last tiles first
        self.current = ProgramTrace(
            "prefill", pid, seq=seq, kv_head=h // group, heads=(h,), split=0, q_tile=tile,
            row_tokens=q_start + rows, row_positions=ctx + rows,
            row_labels=[f"query {ctx + r}" for r in rows], key_range=(0, _int(K["hi"])),
        )
        self.programs.append(self.current)


# ---------------------------------------------------------------- entry points
def trace_paged_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, *, block_n: int = 16, num_splits: int = 1,
) -> KernelTrace:
    """Run the paged decode kernel (split-K when ``num_splits > 1``) with ``BLOCK_N = block_n`` and record it."""
    _require_interpreter()
    _check_tile("block_n", block_n)
    rec = _Recorder("paged_decode")
    file, line = _loop_line(_pd.decode_kernel)
    handlers = {"decode_kernel": rec.decode_handler(line), "combine_kernel": rec.combine_handler()}

    def launcher(grid):
        return _pd.decode_kernel[grid], {"BLOCK_N": block_n}

    with _fixed_tiles(_pd, launcher), _tracing(handlers, {file}):
        if num_splits > 1:
            out = _pd.paged_decode_attention_split(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits)
        else:
            out = _pd.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)
    group = q.shape[1] // k_cache.shape[2]
    return _finish(rec, out, next_pow2(group, 16), block_n, k_cache, scale, max(1, num_splits),
                   seq_lens, block_tables)


def trace_prefill(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, *, block_m: int = 16, block_n: int = 16,
) -> KernelTrace:
    """Run the varlen prefill kernel with ``BLOCK_M x BLOCK_N`` tiles and record every key tile of every program."""
    _require_interpreter()
    _check_tile("block_m", block_m)
    _check_tile("block_n", block_n)
    rec = _Recorder("prefill")
    file, line = _loop_line(_pf.attend_tiles)
    handlers = {"prefill_kernel": rec.prefill_kernel_handler(), "attend_tiles": rec.attend_handler(line)}

    def launcher(max_q):
        return _pf.prefill_kernel, {"BLOCK_M": block_m, "BLOCK_N": block_n}

    with _fixed_tiles(_pf, launcher), _tracing(handlers, {file}):
        out = _pf.prefill_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale)
    return _finish(rec, out, block_m, block_n, k_cache, scale, 1, seq_lens, block_tables)


def _finish(rec: _Recorder, out, block_m, block_n, k_cache, scale, num_splits, seq_lens, block_tables) -> KernelTrace:
    page = k_cache.shape[1]
    lens = [int(n) for n in seq_lens.tolist()]
    tables = [[int(b) for b in block_tables[s, : -(-n // page)].tolist()] for s, n in enumerate(lens)]
    return KernelTrace(rec.kernel, out, block_m, block_n, page, k_cache.shape[0], scale * LOG2E, num_splits,
                       lens, tables, rec.programs, rec.steps, rec.combine)


# ---------------------------------------------------------------- references for the recorded state
def decode_logsumexp_ref(q, k_cache, block_tables, seq_lens, scale) -> torch.Tensor:
    """[B, H] natural-log logsumexp of ``scale * q.k`` over each sequence's keys (fp64, plain PyTorch)."""
    B, H, _ = q.shape
    kvh, bs = k_cache.shape[2], k_cache.shape[1]
    lse = torch.empty(B, H, dtype=torch.float64)
    for b in range(B):
        pos = torch.arange(int(seq_lens[b]))
        k = k_cache[block_tables[b].long()[pos // bs], pos % bs].double().repeat_interleave(H // kvh, dim=1)
        lse[b] = (torch.einsum("hd,nhd->hn", q[b].double(), k) * scale).logsumexp(-1)
    return lse


def prefill_logsumexp_ref(q, k_cache, cu_seqlens_q, seq_lens, block_tables, scale) -> torch.Tensor:
    """[T, H] natural-log logsumexp over the keys each query may see (offset-causal), fp64."""
    T, H, _ = q.shape
    kvh, bs = k_cache.shape[2], k_cache.shape[1]
    lse = torch.full((T, H), float("nan"), dtype=torch.float64)
    cu = cu_seqlens_q.tolist()
    for s, n in enumerate(seq_lens.tolist()):
        a, b = cu[s], cu[s + 1]
        pos = torch.arange(n)
        k = k_cache[block_tables[s].long()[pos // bs], pos % bs].double().repeat_interleave(H // kvh, dim=1)
        qpos = torch.arange(n - (b - a), n)
        sc = torch.einsum("qhd,khd->hqk", q[a:b].double(), k) * scale
        sc.masked_fill_(pos[None, None, :] > qpos[None, :, None], float("-inf"))
        lse[a:b] = sc.logsumexp(-1).T
    return lse


# ---------------------------------------------------------------- figures (plotly, imported on first use)
@dataclass
class TileView:
    """What the figure shows: one sequence (and one head) of a trace, its steps in execution order."""

    trace: KernelTrace
    seq: int
    head: int
    programs: list[ProgramTrace]
    steps: list[TileStep]
    row_positions: list[int]  # heatmap rows: query heads (decode) or query positions (prefill)
    row_labels: list[str]

    def __len__(self) -> int:
        return len(self.steps)


def tile_view(trace: KernelTrace, seq: int = 0, head: int = 0) -> TileView:
    progs = trace.programs_of(seq, head)
    if not progs:
        raise ValueError(f"no program of the trace worked on sequence {seq}, head {head}")
    idx = {id(p) for p in progs}
    steps = [st for st in trace.steps if id(trace.programs[st.program]) in idx]
    if trace.kernel == "paged_decode":
        rows = list(progs[0].heads)
        labels = [f"head {h}" for h in rows]
    else:
        pairs = sorted({(int(r), lab) for p in progs for r, lab in zip(p.row_positions, p.row_labels)})
        rows, labels = [r for r, _ in pairs], [lab for _, lab in pairs]
    return TileView(trace, seq, head, progs, steps, rows, labels)


_PHASE_COLOR = {False: "#2a9d8f", True: "#e76f51"}  # full tile, causally masked tile
_MAX_LINES = 4  # rows drawn in the running max / sum panels


def tile_figure(view: TileView, k: int | None = None, *, height: int = 620):
    """A plotly Figure of ``view`` after its step ``k`` (default: the last): scores filled so far,
    the pool's blocks (how often each was read, the current tile's outlined), running max and sum."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    tr = view.trace
    k = len(view.steps) - 1 if k is None else max(0, min(k, len(view.steps) - 1))
    cur = view.steps[k]
    prog = tr.programs[cur.program]
    n_keys = tr.seq_lens[view.seq]
    row_of = {r: i for i, r in enumerate(view.row_positions)}
    decode = tr.kernel == "paged_decode"

    # scores revealed so far: rows x keys, NaN = not computed yet or masked
    z = np.full((len(view.row_positions), n_keys), np.nan)
    reads = np.zeros(tr.num_blocks)
    for st in view.steps[: k + 1]:
        p = tr.programs[st.program]
        rows = [row_of[h] for h in p.heads] if decode else [row_of[int(r)] for r in p.row_positions]
        keep = st.key_pos < n_keys
        for j, r in enumerate(rows):
            vals = np.where(st.visible[j], st.scores[j], np.nan)[keep]
            z[r, st.key_pos[keep]] = vals
        for b in st.block_ids[st.loaded]:
            reads[b] += 1  # one K row (and its V row) read from block b
    table = tr.block_tables[view.seq]
    hover_keys = [f"key {j}: block {table[j // tr.page]}, slot {j % tr.page}" for j in range(n_keys)]

    fig = make_subplots(
        rows=2, cols=2, column_widths=[0.62, 0.38], row_heights=[0.58, 0.42], horizontal_spacing=0.09,
        vertical_spacing=0.16,
        subplot_titles=("scores q.k * scale * log2(e), tile by tile", "KV pool: keys read per block",
                        "running max m (log2 units)", "running sum l"))
    fig.add_trace(go.Heatmap(
        z=z, x=list(range(n_keys)), y=view.row_labels, colorscale="Viridis", showscale=False,
        customdata=[hover_keys] * len(view.row_labels), hoverongaps=False,
        hovertemplate="%{y}, %{customdata}<br>s = %{z:.2f}<extra></extra>", name="scores"), 1, 1)

    # the pool as a grid of blocks; blocks outside this sequence's table are blank
    cols = 8
    nrow = -(-tr.num_blocks // cols)
    owner = set(table)
    pz = np.full((nrow, cols), np.nan)
    text = [["" for _ in range(cols)] for _ in range(nrow)]
    logical = {b: i for i, b in enumerate(table)}
    hov = [["" for _ in range(cols)] for _ in range(nrow)]
    for b in range(tr.num_blocks):
        r, c = divmod(b, cols)
        text[r][c] = str(b)
        if b in owner:
            pz[r, c] = reads[b]
            lo = logical[b] * tr.page
            hov[r][c] = (f"block {b}: logical block {logical[b]} (keys {lo}-{lo + tr.page - 1}), "
                         f"{int(reads[b])} key reads")
        else:
            hov[r][c] = f"block {b}: not this sequence's"
    fig.add_trace(go.Heatmap(
        z=pz, text=text, texttemplate="%{text}", customdata=hov, colorscale="Blues", zmin=0,
        zmax=max(1.0, float(reads.max())), showscale=False, hoverongaps=False, xgap=3, ygap=3,
        hovertemplate="%{customdata}<extra></extra>", name="pool"), 1, 2)

    # running max and sum of the current program's rows, tile by tile
    done = prog.steps[: cur.tile + 1]
    n_rows = len(prog.row_labels)
    count = min(_MAX_LINES, n_rows)
    pick = [round(i * (n_rows - 1) / max(1, count - 1)) for i in range(count)]  # evenly spread rows
    palette = ["#264653", "#e9c46a", "#f4a261", "#9b5de5"]
    for i in range(_MAX_LINES):
        has = i < len(pick)
        r = pick[i] if has else 0
        x = [st.tile for st in done] if has else []
        name = prog.row_labels[r] if has else ""
        fig.add_trace(go.Scatter(x=x, y=[float(st.m[r]) for st in done] if has else [], mode="lines+markers",
                                 name=name, legendgroup=str(i), line=dict(color=palette[i]), showlegend=has), 2, 1)
        fig.add_trace(go.Scatter(x=x, y=[float(st.l[r]) for st in done] if has else [], mode="lines+markers",
                                 name=name, legendgroup=str(i), line=dict(color=palette[i], dash="dot"),
                                 showlegend=False), 2, 2)
    n_tiles = max(1, len(prog.steps))
    for c in (1, 2):
        fig.update_xaxes(title_text="key tile of this program", range=[-0.5, n_tiles - 0.5], dtick=1, row=2, col=c)

    # outlines: every tile computed so far (colour = phase), the current one thick and red
    shapes = []
    for st in view.steps[: k + 1]:
        p = tr.programs[st.program]
        if decode:
            y0, y1 = -0.5, len(view.row_labels) - 0.5
        else:
            ys = [row_of[int(r)] for r in p.row_positions]
            y0, y1 = min(ys) - 0.5, max(ys) + 0.5
        x1 = min(st.key_start + tr.block_n, n_keys) - 0.5
        now = st is cur
        shapes.append(dict(type="rect", xref="x", yref="y", x0=st.key_start - 0.5, x1=x1, y0=y0, y1=y1,
                           line=dict(color="red" if now else _PHASE_COLOR[st.causal], width=3 if now else 1.5)))
    for b in cur.blocks:
        r, c = divmod(b, cols)
        shapes.append(dict(type="rect", xref="x2", yref="y2", x0=c - 0.5, x1=c + 0.5, y0=r - 0.5, y1=r + 0.5,
                           line=dict(color="red", width=3)))
    fig.update_layout(shapes=shapes)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(autorange="reversed", showticklabels=False, row=1, col=2)
    fig.update_xaxes(title_text="key position", row=1, col=1)
    fig.update_xaxes(showticklabels=False, row=1, col=2)
    phase = "causal mask" if cur.causal else ("no mask" if not decode else "masked past seq_len")
    keys = f"keys {cur.key_start}-{cur.key_start + tr.block_n - 1}"
    fig.update_layout(
        height=height, margin=dict(l=70, r=20, t=80, b=40), legend=dict(orientation="h", y=-0.12),
        title=dict(text=f"{tr.kernel}, step {k + 1}/{len(view.steps)}: program ({prog.title}), "
                        f"tile {cur.tile + 1}/{n_tiles}, {keys} ({phase}), blocks {cur.blocks}", font=dict(size=13)),
        meta=f"{tr.kernel} tiles",
    )
    return fig

