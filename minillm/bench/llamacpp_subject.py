"""llama.cpp as a benchmark subject, through llama-cpp-python's low-level (C) API on the same GGUF.

Why the low-level API: the high-level `Llama` class runs one sequence at a
time and does not expose the weight-repacking switch. Here we set
`llama_model_params.use_extra_bufts` ourselves (extra buffer types = runtime
weight repacking for the CPU's matmul kernels; on AMX CPUs the AMX buffer) and
drive `llama_decode` with `llama_batch`es that carry several sequence ids.

How it is driven (stated in every report):
- decode / prefill: one sequence; the prompt in one batch (chunks of n_batch),
  then one token per `llama_decode`; greedy = argmax of the returned logits.
- serve: continuous batching the way llama-server's slots do it: up to
  n_seq_max sequences (one KV "seq id" each, each in its own KV stream:
  `kv_unified = false`, llama.cpp's faster multi-sequence mode: on the default
  128-request workload, 1 thread, one unified cache gave 19.8 output tok/s
  and separate streams 50.4, since with one cache every step attends over
  the cells of all sequences); each
  `llama_decode` carries one token per running sequence plus prompt tokens of
  newly admitted ones (up to n_batch tokens); a finished sequence's KV is
  removed and its slot goes to the next waiting request.

llama-cpp-python is an optional extra (`pip install minillm[peers]`); when it
is missing, `llama_cpp_available()` says why and the benchmark goes on without it.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minillm.bench.subject import BatchRun, DecodeRun

NOT_INSTALLED = ("llama.cpp peer skipped: llama-cpp-python is not installed "
                 "(pip install 'minillm[peers]', or CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install llama-cpp-python)")

DRIVEN = ("llama-cpp-python low-level API: decode/prefill one sequence (prompt in one llama_batch, then one token "
          "per llama_decode, greedy argmax); serve: continuous batching over n_seq_max sequence ids, one KV "
          "stream each (kv_unified=false) (one llama_batch per step: a token per running sequence + prompt tokens of admitted ones)")


def llama_cpp_available() -> tuple[bool, str]:
    """(importable, reason when not). Only looks; importing happens in load_llama_cpp."""
    if importlib.util.find_spec("llama_cpp") is None:
        return False, NOT_INSTALLED
    return True, ""


def llama_cpp_version() -> str | None:
    try:
        from importlib import metadata

        return metadata.version("llama-cpp-python")
    except Exception:  # not installed
        return None


_QUIET_LOG: Any = None  # keep the ctypes callback alive for as long as the library may call it


def _quiet_logs(lib: Any) -> None:
    """llama.cpp prints every tensor it loads to stderr; keep only errors."""
    global _QUIET_LOG
    if _QUIET_LOG is None:
        def _log(level: int, text: bytes, user_data: Any) -> None:
            if level == 4 and text:  # GGML_LOG_LEVEL_ERROR
                os.write(2, text)

        _QUIET_LOG = lib.llama_log_callback(_log)
        lib.llama_log_set(_QUIET_LOG, ctypes.c_void_p(0))


@dataclass
class _Context:
    ptr: Any
    n_ctx: int
    n_seq_max: int
    n_batch: int


@dataclass
class LlamaCppSubject:
    """One loaded GGUF in llama.cpp; `repack` is `use_extra_bufts` (runtime weight repacking)."""

    lib: Any
    model: Any
    n_vocab: int
    repack: bool
    n_threads: int
    n_batch: int = 512
    max_num_seqs: int = 64  # serve(): sequences decoded together (llama-server's "slots")
    name: str = "llama.cpp"
    _ctx: _Context | None = field(default=None, repr=False)

    # ----- context and batches ---------------------------------------------------------
    def context(self, n_ctx: int, n_seq_max: int = 1) -> _Context:
        """A context with room for n_ctx tokens in each of n_seq_max sequences (reused when big enough)."""
        per_seq = max(256, -(-n_ctx // 256) * 256)
        c = self._ctx
        if c is not None and c.n_ctx >= per_seq * n_seq_max and c.n_seq_max == n_seq_max:
            self.lib.llama_memory_clear(self.lib.llama_get_memory(c.ptr), True)
            return c
        self.close_context()
        p = self.lib.llama_context_default_params()
        p.n_ctx = per_seq * n_seq_max  # split evenly into one stream per sequence
        p.n_batch = p.n_ubatch = self.n_batch
        p.n_seq_max = n_seq_max
        p.n_threads = p.n_threads_batch = self.n_threads
        p.kv_unified = False  # a stream per sequence: attention reads only that sequence's cells
        p.no_perf = True
        ptr = self.lib.llama_init_from_model(self.model, p)
        if not ptr:
            raise RuntimeError(f"llama.cpp could not create a context (n_ctx={p.n_ctx}, n_seq_max={n_seq_max})")
        self._ctx = _Context(ptr, int(p.n_ctx), n_seq_max, self.n_batch)
        return self._ctx

    def close_context(self) -> None:
        if self._ctx is not None:
            self.lib.llama_free(self._ctx.ptr)
            self._ctx = None

    def close(self) -> None:
        self.close_context()
        if self.model is not None:
            self.lib.llama_model_free(self.model)
            self.model = None

    def _decode(self, ctx: _Context, items: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, seq id, wants logits) items."""
        lib, n = self.lib, len(items)
        batch = lib.llama_batch_init(n, 0, 1)
        try:
            for i, (tok, pos, seq, out) in enumerate(items):
                batch.token[i] = tok
                batch.pos[i] = pos
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = 1 if out else 0
            batch.n_tokens = n
            rc = lib.llama_decode(ctx.ptr, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc} ({n} tokens)")
        finally:
            lib.llama_batch_free(batch)

    def _argmax(self, ctx: _Context, index: int) -> int:
        logits = self.lib.llama_get_logits_ith(ctx.ptr, index)
        return int(np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).argmax())

    def logits(self, prompt_ids: list[int]) -> np.ndarray:
        """Next-token logits after the prompt (for checks against other engines)."""
        ctx = self.context(len(prompt_ids) + 1)
        self._prompt(ctx, prompt_ids, 0)
        ptr = self.lib.llama_get_logits_ith(ctx.ptr, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def _prompt(self, ctx: _Context, ids: list[int], seq: int) -> int:
        """Prefill one sequence in chunks of n_batch; returns its greedy next token."""
        for start in range(0, len(ids), ctx.n_batch):
            chunk = ids[start:start + ctx.n_batch]
            last = start + len(chunk) == len(ids)
            self._decode(ctx, [(t, start + i, seq, last and i == len(chunk) - 1) for i, t in enumerate(chunk)])
        return self._argmax(ctx, -1)

    # ----- the Subject protocol --------------------------------------------------------
    def decode(self, prompt_ids: list[int], max_tokens: int) -> DecodeRun:
        ctx = self.context(len(prompt_ids) + max_tokens)
        t0 = time.perf_counter()
        tok = self._prompt(ctx, prompt_ids, 0)
        t1 = time.perf_counter()
        pos = len(prompt_ids)
        for _ in range(max_tokens - 1):
            self._decode(ctx, [(tok, pos, 0, True)])
            tok = self._argmax(ctx, 0)
            pos += 1
        return DecodeRun(t1 - t0, time.perf_counter() - t1, max_tokens,
                         bytes_per_token=self.decode_bytes(len(prompt_ids) + max_tokens / 2))

    def decode_bytes(self, mean_context: float) -> float:
        """Bytes one batch-1 decode step reads: every weight tensor as stored in the GGUF (Q4_1 here,
        not minillm's float copy) plus the f16 K/V of the context (llama.cpp's default cache type)."""
        lib, m = self.lib, self.model
        head_dim = lib.llama_model_n_embd(m) // lib.llama_model_n_head(m)
        kv_per_token = lib.llama_model_n_layer(m) * 2 * lib.llama_model_n_head_kv(m) * head_dim * 2
        return float(lib.llama_model_size(m)) + kv_per_token * mean_context

    def prefill(self, prompt_ids: list[int]) -> float:
        ctx = self.context(len(prompt_ids) + 1)
        t0 = time.perf_counter()
        self._prompt(ctx, prompt_ids, 0)
        return time.perf_counter() - t0

    def serve(self, prompts: list[list[int]], output_lens: list[int]) -> BatchRun:
        """Continuous batching over seq ids (see the module docstring). All requests arrive at t=0."""
        slots = min(self.max_num_seqs, len(prompts))
        per_req = [len(p) + n for p, n in zip(prompts, output_lens)]
        # every slot has room for the longest request, so no admission waits for KV space
        ctx = self.context(max(per_req) + 1, slots)
        mem = self.lib.llama_get_memory(ctx.ptr)
        t_start = time.perf_counter()
        waiting = list(range(len(prompts)))
        free_seqs = list(range(slots))
        running: dict[int, dict[str, Any]] = {}  # seq id -> {req, pos, next, produced, times}
        ttft = [0.0] * len(prompts)
        tpot: list[float] = []
        steps = 0
        while waiting or running:
            items: list[tuple[int, int, int, bool]] = []
            order: list[tuple[int, bool, int]] = []  # (seq, is_prompt, batch row) for each wanted logit
            for seq, st in running.items():
                order.append((seq, False, len(items)))
                items.append((st["next"], st["pos"], seq, True))
            budget = ctx.n_batch - len(items)
            while waiting and free_seqs and len(prompts[waiting[0]]) <= budget:
                req, seq = waiting.pop(0), free_seqs.pop(0)
                p = prompts[req]
                items += [(t, i, seq, i == len(p) - 1) for i, t in enumerate(p)]
                order.append((seq, True, len(items) - 1))
                running[seq] = {"req": req, "pos": len(p), "next": -1, "produced": 0, "times": []}
                budget -= len(p)
            if not items:  # a prompt longer than n_batch with nothing else running: prefill it alone
                req, seq = waiting.pop(0), free_seqs.pop(0)
                running[seq] = {"req": req, "pos": len(prompts[req]), "next": -1, "produced": 0, "times": []}
                running[seq]["next"] = self._prompt(ctx, prompts[req], seq)
                order = []
                now = time.perf_counter()
                self._record(running, seq, now)
            else:
                self._decode(ctx, items)
                now = time.perf_counter()
                for seq, is_prompt, row in order:
                    st = running[seq]
                    st["next"] = self._argmax(ctx, row)
                    if not is_prompt:
                        st["pos"] += 1
                    self._record(running, seq, now)
            steps += 1
            for seq in [s for s, st in running.items() if st["produced"] >= output_lens[st["req"]]]:
                st = running.pop(seq)
                times = st["times"]
                ttft[st["req"]] = times[0] - t_start
                if len(times) >= 2:
                    tpot.append((times[-1] - times[0]) / (len(times) - 1))
                self.lib.llama_memory_seq_rm(mem, seq, -1, -1)
                free_seqs.append(seq)
        return BatchRun(
            wall_s=time.perf_counter() - t_start,
            prompt_tokens=sum(len(p) for p in prompts),
            output_tokens=sum(output_lens),
            generated_tokens=sum(output_lens),  # continuous batching: no padding
            ttft_s=ttft, tpot_s=tpot, num_steps=steps,
        )

    @staticmethod
    def _record(running: dict[int, dict[str, Any]], seq: int, now: float) -> None:
        st = running[seq]
        st["produced"] += 1
        st["times"].append(now)


def load_llama_cpp(gguf_path: str, repack: bool, n_threads: int, n_batch: int = 512, max_num_seqs: int = 64,
                   name: str | None = None) -> LlamaCppSubject:
    """Load the GGUF with llama.cpp on the CPU; repack sets use_extra_bufts (runtime weight repacking)."""
    ok, why = llama_cpp_available()
    if not ok:
        raise ImportError(why)
    import llama_cpp as lib

    _quiet_logs(lib)
    lib.llama_backend_init()
    mp = lib.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = repack
    model = lib.llama_model_load_from_file(gguf_path.encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {gguf_path}")
    n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
    return LlamaCppSubject(lib, model, n_vocab, repack, n_threads, n_batch, max_num_seqs,
                           name or ("llama.cpp" if repack else "llama.cpp-norepack"))


# llama.cpp's file types for a float GGUF (llama.h, enum llama_ftype)
FLOAT_FTYPES = {"float32": 0, "bfloat16": 32}  # LLAMA_FTYPE_ALL_F32, LLAMA_FTYPE_MOSTLY_BF16


def float_gguf(gguf_path: str, dtype: str, cache_dir: str | None = None) -> str:
    """The GGUF with every weight in `dtype` (float32 or bfloat16), written once by llama.cpp's own
    quantizer (allowed to requantize: Q4_1 blocks dequantized, as minillm dequantizes them) into the
    models' cache folder (loader/registry.cache_dir) and reused. A float minillm run reads float
    weights; llama.cpp on the quantized file would read a fifth of the bytes, another workload.
    Returns the path."""
    import hashlib
    from pathlib import Path

    ok, why = llama_cpp_available()
    if not ok:
        raise ImportError(why)
    if dtype not in FLOAT_FTYPES:
        raise ValueError(f"a float GGUF is float32 or bfloat16, not {dtype}")
    import llama_cpp as lib

    src = Path(gguf_path)
    stat = src.stat()
    key = hashlib.sha256(f"{src.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    if cache_dir is None:
        from minillm.loader.registry import cache_dir as models_dir

        cache_dir = str(models_dir())
    out = Path(cache_dir) / f"{src.stem}.{dtype}.{key}.gguf"
    if out.exists():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    params = lib.llama_model_quantize_default_params()
    params.ftype = FLOAT_FTYPES[dtype]
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    partial = out.with_suffix(".partial")
    _quiet_logs(lib)
    if lib.llama_model_quantize(str(src).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not write a {dtype} copy of {src.name}")
    partial.rename(out)  # whole or absent: a killed run leaves no half file under the final name
    return str(out)


def probe_llama_cpp(gguf_path: str, repack: bool, n_threads: int = 1, timeout_s: float = 300.0) -> str | None:
    """Load and decode a few tokens (also batched) in a child process: None when that works, else why not.

    Some builds crash (SIGSEGV, not an exception) on the first decode with weight repacking on;
    a crash in a child costs one line in the report instead of the whole benchmark.
    """
    import subprocess
    import sys

    code = ("import sys; from minillm.bench.llamacpp_subject import load_llama_cpp as L; "
            "s = L(sys.argv[1], sys.argv[2] == '1', int(sys.argv[3]), max_num_seqs=2); "
            "s.decode([1, 2, 3, 4], 4); s.serve([[1, 2, 3], [4, 5, 6, 7]], [3, 2]); s.close()")
    try:
        run = subprocess.run([sys.executable, "-c", code, gguf_path, str(int(repack)), str(n_threads)],
                             capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"repack={int(repack)}: a 4-token probe did not finish in {timeout_s:.0f} s"
    if run.returncode == 0:
        return None
    how = f"signal {-run.returncode}" if run.returncode < 0 else f"exit code {run.returncode}"
    tail = " | ".join(run.stderr.strip().splitlines()[-2:])
    return f"repack={int(repack)}: a probe load + decode failed ({how}){': ' + tail if tail else ''}"


def system_info() -> str | None:
    """llama.cpp's own summary of the CPU features it was built with (AVX512, AMX, REPACK...)."""
    try:
        import llama_cpp as lib

        return lib.llama_print_system_info().decode(errors="replace").strip()
    except Exception:  # not installed or an old binding
        return None
