"""Rank 0's side of tensor parallelism: the engine calls it exactly like ModelRunner.run.

    engine.runner = TPExecutor(model, TensorParallelConfig(size=3), cache_config, "torch")
    result = engine.runner.run(chunks)     # broadcast the batch, forward on all ranks, sample here

Rank 0 lives in the front-end process: it runs the scheduler, block manager and
sampler as with one rank, so continuous batching, prefix caching and chunked
prefill do not change -- every rank's KV pool has the same block count and the
broadcast block tables index all of them alike.

With `pipeline=True` the same executor drives pipeline stages (pipeline.py):
each worker keeps some layers instead of a slice of every layer.

Failure handling: before each step rank 0 checks the workers are alive; inside
a step, gloo raises when a peer's socket closes (a dead worker) or when rank 0
waits longer than `timeout_s` (a hung one). Either way the front end gets a
TensorParallelError naming the rank, and the executor refuses further steps.
"""
from __future__ import annotations

import os
import queue
import time
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minillm.config import CacheConfig
from minillm.engine.model_runner import ModelRunner, plan_kv_cache
from minillm.engine.sampler import SampleResult, sample
from minillm.engine.scheduler import ScheduledChunk
from minillm.parallel import comm
from minillm.parallel.batch import StepBatch, forward_batch
from minillm.parallel.group import destroy_group, free_port, init_group
from minillm.parallel.pipeline import check_pp_size, forward_pipeline, shard_pipeline
from minillm.parallel.shard import check_tp_size, shard_model
from minillm.parallel.worker import WorkerArgs, worker_main


class TensorParallelError(RuntimeError):
    """A worker died, hung, or failed to start; the tensor-parallel engine cannot continue."""


@dataclass
class TensorParallelConfig:
    size: int
    model: str | None = None  # what each worker passes to load_model (None: the default model)
    dtype: torch.dtype = torch.float32
    timeout_s: float = 60.0  # rank 0's longest wait in a collective before calling a worker hung
    startup_timeout_s: float = 600.0  # loading the model in every worker
    worker_threads: int | None = None  # default: the CPU cores shared evenly among ranks
    pipeline: bool = False  # split the layers into stages (pipeline.py) instead of splitting every layer


class TPExecutor:
    def __init__(
        self, model, config: TensorParallelConfig, cache_config: CacheConfig, attention_backend: str = "torch"
    ) -> None:
        if config.size < 2:
            raise ValueError("TPExecutor is for tensor_parallel_size >= 2 (one rank uses ModelRunner)")
        (check_pp_size if config.pipeline else check_tp_size)(model.config, config.size)  # before spawning
        if dist.is_initialized():
            raise RuntimeError(
                "a torch.distributed process group already exists in this process: one tensor-parallel "
                "engine per process at a time (close() the other LLM first)")
        self.config = config
        self.size = config.size
        self._error: str | None = None
        self._closed = False
        device = model.embed_tokens.weight.device
        if device.type == "cuda" and torch.cuda.device_count() < config.size:
            raise ValueError(f"tensor_parallel_size={config.size} needs one GPU per rank; "
                             f"{torch.cuda.device_count()} visible")
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's object collectives use the current device
        threads = config.worker_threads or max(1, (os.cpu_count() or 1) // config.size)
        port = free_port()
        ctx = mp.get_context("spawn")
        self._status = ctx.Queue()
        self.workers = []
        for rank in range(1, config.size):
            dev = f"cuda:{rank}" if device.type == "cuda" else "cpu"
            args = WorkerArgs(rank, config.size, port, config.model, config.dtype, dev, attention_backend,
                              cache_config, threads, config.pipeline)
            p = ctx.Process(target=worker_main, args=(args, self._status), daemon=True, name=f"minillm-tp{rank}")
            p.start()
            self.workers.append(p)
        # from here on, whatever happens, the workers must not outlive this object: the
        # finalizer runs if it is garbage-collected unclosed, or at interpreter exit
        self._finalizer = weakref.finalize(self, _reap, self.workers)
        try:
            (shard_pipeline if config.pipeline else shard_model)(model, 0, config.size)
            self._wait_loaded(config.startup_timeout_s)
            init_group(0, config.size, port, device, config.timeout_s)
            spec = plan_kv_cache(model, cache_config, device)
            dist.broadcast_object_list([spec.num_blocks], src=0)
            self.runner = ModelRunner(model, spec, attention_backend)
        except BaseException:
            self._kill_workers()
            destroy_group()
            self._finalizer.detach()
            raise
        comm.STATS.take()

    # ----- ModelRunner's interface --------------------------------------------------------
    @property
    def model(self):
        return self.runner.model

    @property
    def spec(self):
        return self.runner.spec

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def backend(self):
        return self.runner.backend

    @property
    def kv_cache_bytes(self) -> int:
        """Rank 0's pool; every rank holds one of the same size."""
        return self.runner.kv_cache_bytes

    def attach(self) -> None:
        self.runner.attach()

    def run(self, chunks: list[ScheduledChunk]) -> SampleResult | None:
        """Broadcast the step, forward on every rank, sample on rank 0."""
        self._check_usable()
        batch = StepBatch.from_chunks(chunks)
        try:
            dist.broadcast_object_list([batch], src=0)
            logits = (forward_pipeline if self.config.pipeline else forward_batch)(self.runner, batch)
        except RuntimeError as e:  # gloo: a peer closed its socket, or the wait timed out
            raise self._fail(f"a collective failed: {e}") from e
        except BaseException as e:
            # Ctrl-C (or any other exit) between two collectives: the workers now wait in a
            # collective rank 0 will never issue, so the ranks are out of step for good
            self._error = f"rank 0 left a step half-done ({type(e).__name__}); the workers were stopped"
            self._kill_workers()
            raise
        if logits is None:
            return None
        seqs = [c.seq for c in chunks if c.completes]
        return sample(logits, [s.params for s in seqs], [s.generator for s in seqs])

    def take_comm_stats(self) -> comm.CommStats:
        """Bytes all-reduced / all-gathered (and time) since the last call: one step's worth."""
        return comm.STATS.take()

    # ----- life and death --------------------------------------------------------------------
    def _wait_loaded(self, timeout_s: float) -> None:
        pending = set(range(1, self.size))
        deadline = time.monotonic() + timeout_s
        while pending:
            try:
                rank, what, info = self._status.get(timeout=0.2)
            except queue.Empty:
                dead = self._dead_workers()
                if dead:
                    raise TensorParallelError(
                        f"tensor-parallel worker {dead} exited while loading the model{self._worker_errors()}")
                if time.monotonic() > deadline:
                    raise TensorParallelError(
                        f"tensor-parallel workers {sorted(pending)} did not load the model within {timeout_s:.0f} s")
                continue
            if what == "error":
                raise TensorParallelError(f"tensor-parallel worker rank {rank} failed to start:\n{info}")
            pending.discard(rank)

    def _dead_workers(self) -> str:
        return ", ".join(f"rank {r} (exit code {p.exitcode})" for r, p in enumerate(self.workers, 1)
                         if not p.is_alive())

    def _check_usable(self) -> None:
        if self._error is not None:
            raise TensorParallelError(f"the tensor-parallel engine is down: {self._error}")
        if self._closed:
            raise TensorParallelError("the tensor-parallel engine was closed")
        dead = self._dead_workers()
        if dead:
            raise self._fail("worker exited")

    def _fail(self, what: str) -> TensorParallelError:
        time.sleep(0.5)  # a worker killed mid-step may need a moment to be reaped
        dead = self._dead_workers()
        tail = self._worker_errors(last_line_only=True)
        if dead:
            self._error = f"tensor-parallel worker {dead} died ({what}){tail}"
        else:
            self._error = (f"a tensor-parallel worker did not answer within {self.config.timeout_s:.0f} s "
                           f"(hung?) ({what}){tail}")
        self._kill_workers()
        return TensorParallelError(self._error)

    def _worker_errors(self, last_line_only: bool = False) -> str:
        """What workers that caught an exception reported (their traceback, or its last line)."""
        out = ""
        while True:
            try:
                rank, kind, info = self._status.get(timeout=0.5)
            except (queue.Empty, OSError, ValueError):
                return out
            if kind == "error":
                out += f"\nrank {rank}: " + (info.strip().splitlines()[-1] if last_line_only else info)

    def _kill_workers(self) -> None:
        for p in self.workers:
            if p.is_alive():
                p.kill()
        for p in self.workers:
            p.join(timeout=10)

    def close(self) -> None:
        """Tell the workers to stop, wait for them (then kill stragglers), leave the process group."""
        if self._closed:
            return
        self._closed = True
        if self._error is None and dist.is_initialized() and not self._dead_workers():
            try:
                dist.broadcast_object_list([None], src=0)
            except RuntimeError:
                pass
            for p in self.workers:
                p.join(timeout=10)
        self._kill_workers()
        destroy_group()
        self._finalizer.detach()


def _reap(workers) -> None:
    """Last resort for an executor nobody closed: kill its workers, leave the process group."""
    for p in workers:
        if p.is_alive():
            p.kill()
        p.join(timeout=10)
    destroy_group()
