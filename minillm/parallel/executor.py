"""Rank 0's side of a model split over processes: the Executor the engine calls when world_size > 1.

    executor = make_parallel_executor(model, config)   # launch.py; model: rank 0's loaded full model, sharded in place
    logits = executor.execute(step_batch)               # broadcast, forward on every rank; rank 0's logits
    executor.take_comm_stats(); executor.close()

Two executors, one base (MultiprocExecutor: start, health, close):

    TensorParallelExecutor    every layer split over N ranks (shard.py); each rank runs ModelRunner.execute
                              on its shard, the collectives inside the model line the ranks up
    PipelineParallelExecutor  the layers split into N stages (pipeline.py); forward_pipeline

Rank 0 lives in the front-end process: it runs the scheduler, block manager and
sampler as with one rank, so continuous batching, prefix caching and chunked
prefill do not change -- every rank's KV pool has the same block count and the
broadcast block tables index all of them alike.

Starting the workers: "fork" on Linux while CUDA is not initialised in this process
(as vLLM does), else "spawn". Fork does not re-import the main module, so a script
that builds `LLM(tensor_parallel_size=2)` at its top level, with no
`if __name__ == "__main__":` guard, works; under spawn each worker re-runs that
top level, and the executor then stops with a TensorParallelError saying to add
the guard. Fork is made safe for torch's OpenMP thread pool by releasing the pool
just before forking (see `_release_openmp_pool`), and is not used while threads of
an earlier process group still run here (see `_fork_blocker`).

Failure handling: before each step rank 0 checks the workers are alive; inside
a step, gloo raises when a peer's socket closes (a dead worker) or when rank 0
waits longer than `distributed_timeout_s` (a hung one). Either way the front end gets
a TensorParallelError naming the rank, and the executor refuses further steps.
"""
from __future__ import annotations

import ctypes
import gc
import os
import queue
import signal
import sys
import time
import weakref
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minillm.engine.batch import StepBatch
from minillm.engine.config import EngineConfig
from minillm.engine.executor import Executor
from minillm.engine.kv_cache import plan_kv_cache
from minillm.engine.model_runner import ModelRunner
from minillm.parallel import comm
from minillm.parallel.group import destroy_group, free_port, init_group
from minillm.parallel.pipeline import check_pp_size, forward_pipeline
from minillm.parallel.shard import check_tp_size
from minillm.parallel.worker import PIPELINE, TENSOR, WorkerArgs, shard_for, worker_main

# None: choose (fork where safe, else spawn); "fork" / "spawn" / "forkserver" to force one (tests, debugging)
START_METHOD: str | None = None
# A spawned worker that re-ran an unguarded script up to LLM(...) exits with this code (see refuse_unguarded_main)
EXIT_UNGUARDED_MAIN = 87
UNGUARDED_MAIN_HELP = (
    "the worker processes are started with 'spawn' ({why}), which runs the main script's top level again "
    "in every worker, and this script builds the LLM there. Put the LLM construction under\n"
    '    if __name__ == "__main__":\n'
    "(see https://docs.python.org/3/library/multiprocessing.html#the-spawn-and-forkserver-start-methods)"
)


class TensorParallelError(RuntimeError):
    """A worker died, hung, or failed to start; the tensor/pipeline-parallel engine cannot continue."""


# ----- how workers are started --------------------------------------------------------------
def _openmp_runtimes() -> list[ctypes.CDLL]:
    """Every GNU libgomp loaded in this process: torch's wheel bundles one, and other wheels bring
    their own copies (sentencepiece's, for one), each with a thread pool of its own."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "libgomp" in line and "/" in line})
    except OSError:
        return []
    libs = []
    for path in paths:
        try:
            libs.append(ctypes.CDLL(path))  # already loaded: the same handle, nothing new initialised
        except OSError:
            continue
    return libs


def _release_openmp_pool() -> bool:
    """Make fork safe for OpenMP: stop this thread's libgomp worker threads; True if fork is now safe.

    libgomp has no fork handler (GCC bug 60035): a child forked after the parent ran a parallel
    region with > 1 thread inherits a pool that says its threads exist, and its first parallel
    region (a matmul, an elementwise op on a large tensor) waits for them forever. Measured here
    (torch 2.13 CPU wheel, its bundled libgomp): the parent ran a 2-thread matmul, the forked
    child set 2 threads and hung in its first matmul; with omp_pause_resource_all() called in
    the parent just before fork, the child runs and starts a pool of its own (it then has 2
    OpenMP threads). This process's next parallel region starts a new pool too (thread
    creation: microseconds). Every loaded copy of libgomp is paused: loading a tokenizer can
    bring sentencepiece's own copy. torch's own at-fork handlers reset its pthreadpool and
    inter-op pool in the child, not OpenMP's pool.
    """
    for lib in _openmp_runtimes():
        try:
            pause = lib.omp_pause_resource_all  # OpenMP 5.0, libgomp since GCC 9
        except AttributeError:
            return False
        pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
        if pause(1) != 0:  # omp_pause_soft; nonzero: called inside a parallel region
            return False
    # no libgomp loaded: nothing to release (Intel / LLVM OpenMP, libiomp5 / libomp, carry fork
    # handlers of their own; not measured here: torch's Linux wheels use libgomp)
    return True


def _process_group_threads() -> list[str]:
    """Names of torch.distributed's native threads running in this process (gloo's, the TCP store's)."""
    names = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:  # not Linux: fork is not used there anyway
        return names
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if comm.startswith(("pt_", "gloo")):
            names.append(comm)
    return names


def _fork_blocker() -> str | None:
    """Collect dead process groups here, then say why fork is still unsafe (None: it is safe).

    An engine whose worker died or hung leaves its gloo process group in a reference
    cycle (through the exception), alive with its threads after destroy_process_group.
    Forked as it is, a child inherits the object but not the threads, and when the
    child's garbage collector frees it, ~ProcessGroupGloo waits on those threads
    forever. Seen in CI and reproduced (py-spy: the worker of the test after the
    hung-worker test sat in ~ProcessGroupGloo, called from gc inside the tokenizer
    load). So: collect here, where the threads exist, and freeze what is left at fork
    (`_frozen_for_fork`); if a group's threads still run, spawn instead.
    """
    gc.collect()
    deadline = time.monotonic() + 2.0
    while _process_group_threads() and time.monotonic() < deadline:  # their joins finish
        time.sleep(0.05)
    left = _process_group_threads()
    if left:
        return f"threads of an earlier process group are still running here ({', '.join(sorted(set(left)))})"
    return None


@contextmanager
def _frozen_for_fork():
    """Children forked inside never collect the objects they inherit (gc.freeze), so no
    inherited destructor can run in a process that lacks the threads it expects."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def worker_start_method() -> tuple[str, str]:
    """(start method, why): fork on Linux while CUDA is not initialised here, else spawn."""
    if START_METHOD is not None:
        return START_METHOD, f"minillm.parallel.executor.START_METHOD = {START_METHOD!r}"
    if not sys.platform.startswith("linux"):
        return "spawn", f"fork is not safe on {sys.platform}"
    if torch.cuda.is_initialized():
        return "spawn", "CUDA is initialised in this process, and a forked child cannot use it"
    return "fork", "Linux, CUDA not initialised"


def refuse_unguarded_main() -> None:
    """In a spawned worker that is re-running the user's script: stop here, before any process starts.

    multiprocessing would raise its "bootstrapping phase" RuntimeError a moment later; exiting
    with a known code lets rank 0 tell the user what to change.
    """
    if getattr(mp.current_process(), "_inheriting", False):
        print(f"minillm: this spawned worker re-ran the main script up to LLM(...); exiting. "
              f"Put the LLM construction under `if __name__ == \"__main__\":`", file=sys.stderr, flush=True)
        sys.exit(EXIT_UNGUARDED_MAIN)


# ----- rank 0 --------------------------------------------------------------------------------
class MultiprocExecutor(Executor):
    """Rank 0 plus N-1 worker processes: start, health checks, the step's broadcast, close."""

    mode: str  # worker.TENSOR or worker.PIPELINE
    what = "parallel"  # in messages

    @staticmethod
    def check_size(cfg, size: int) -> None:
        raise NotImplementedError

    def _forward(self, batch: StepBatch) -> torch.Tensor | None:
        """Rank 0's part of the step (the workers run the same on their part)."""
        raise NotImplementedError

    def __init__(self, model, config: EngineConfig) -> None:
        refuse_unguarded_main()
        size = config.world_size
        if size < 2:
            raise ValueError(f"{type(self).__name__} is for 2 or more ranks (one rank uses ModelRunner)")
        self.check_size(model.config, size)  # before starting anything
        if dist.is_initialized():
            raise RuntimeError(
                "a torch.distributed process group already exists in this process: one tensor-parallel "
                "engine per process at a time (close() the other LLM first)")
        self.config = config
        self.size = size
        self._error: str | None = None
        self._closed = False
        device = model.embed_tokens.weight.device
        if device.type == "cuda" and torch.cuda.device_count() < size:
            raise ValueError(f"{self.what} size {size} needs one GPU per rank; {torch.cuda.device_count()} visible")
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's object collectives use the current device
        threads = config.worker_threads or max(1, (os.cpu_count() or 1) // size)
        port = free_port()
        method, self._start_why = worker_start_method()
        if method == "fork":
            blocker = _fork_blocker() if START_METHOD is None else None  # (a forced fork is the caller's call)
            if blocker is None and not _release_openmp_pool():
                blocker = "the OpenMP thread pool could not be released before fork"
            if blocker is not None:
                method, self._start_why = "spawn", blocker
        self.start_method = method
        ctx = mp.get_context(method)
        self._status = ctx.Queue()
        self.workers = []
        with _frozen_for_fork():
            for rank in range(1, size):
                dev = f"cuda:{rank}" if device.type == "cuda" else "cpu"
                args = WorkerArgs(rank, port, dev, self.mode, threads, config)
                p = ctx.Process(target=worker_main, args=(args, self._status), daemon=True,
                                name=f"minillm-{self.mode}{rank}")
                p.start()
                self.workers.append(p)
        # from here on, whatever happens, the workers must not outlive this object: the
        # finalizer runs if it is garbage-collected unclosed, or at interpreter exit
        self._finalizer = weakref.finalize(self, _reap, self.workers)
        try:
            shard_for(self.mode)(model, 0, size)
            self._wait_loaded(config.distributed_startup_timeout_s)
            init_group(0, size, port, device, config.distributed_timeout_s)
            self.plan = plan_kv_cache(model, config, device)
            dist.broadcast_object_list([self.plan.num_blocks], src=0)
            self.runner = ModelRunner(model, config, self.plan)
        except BaseException:
            self._kill_workers()
            destroy_group()
            self._finalizer.detach()
            raise
        self.device = self.runner.device
        comm.STATS.take()

    # ----- the Executor interface ---------------------------------------------------------
    @property
    def kv_cache_bytes(self) -> int:
        """Rank 0's pool (tensor parallel: every rank holds one of the same size)."""
        return self.runner.kv_cache_bytes

    def attach(self) -> None:
        self.runner.attach()

    def execute(self, batch: StepBatch) -> torch.Tensor | None:
        """Broadcast the step, run it on every rank; the logits of batch.logit_rows, here on rank 0."""
        self._check_usable()
        try:
            dist.broadcast_object_list([batch], src=0)
            return self._forward(batch)
        except RuntimeError as e:  # gloo: a peer closed its socket, or the wait timed out
            raise self._fail(f"a collective failed: {e}") from e
        except BaseException as e:
            # Ctrl-C (or any other exit) between two collectives: the workers now wait in a
            # collective rank 0 will never issue, so the ranks are out of step for good
            self._error = f"rank 0 left a step half-done ({type(e).__name__}); the workers were stopped"
            self._kill_workers()
            raise

    def take_comm_stats(self) -> comm.CommStats:
        """Bytes all-reduced / all-gathered / sent (and time) since the last call: one step's worth."""
        return comm.STATS.take()

    # ----- life and death --------------------------------------------------------------------
    def _wait_loaded(self, timeout_s: float) -> None:
        pending = set(range(1, self.size))
        deadline = time.monotonic() + timeout_s
        while pending:
            try:
                rank, what, info = self._status.get(timeout=0.2)
            except queue.Empty:
                if any(p.exitcode == EXIT_UNGUARDED_MAIN for p in self.workers):
                    raise TensorParallelError(
                        f"{self.what} workers could not start: "
                        + UNGUARDED_MAIN_HELP.format(why=self._start_why)) from None
                dead = self._dead_workers()
                if dead:
                    raise TensorParallelError(
                        f"{self.what} worker {dead} exited while loading the model{self._worker_errors()}")
                if time.monotonic() > deadline:
                    self._dump_stacks(pending)
                    raise TensorParallelError(
                        f"{self.what} workers {sorted(pending)} did not load the model within {timeout_s:.0f} s "
                        f"(started with {self.start_method!r}: {self._start_why}; their Python stacks were "
                        f"written to stderr)")
                continue
            if what == "error":
                raise TensorParallelError(f"{self.what} worker rank {rank} failed to start:\n{info}")
            pending.discard(rank)

    def _dump_stacks(self, ranks) -> None:
        """Ask stuck workers to print every thread's Python stack (faulthandler, set up in worker_main)."""
        for rank in ranks:
            p = self.workers[rank - 1]
            if p.is_alive() and p.pid is not None:
                try:
                    os.kill(p.pid, signal.SIGUSR1)
                except OSError:
                    pass
        time.sleep(1.0)  # let them write before they are killed

    def _dead_workers(self) -> str:
        return ", ".join(f"rank {r} (exit code {p.exitcode})" for r, p in enumerate(self.workers, 1)
                         if not p.is_alive())

    def _check_usable(self) -> None:
        if self._error is not None:
            raise TensorParallelError(f"the {self.what} engine is down: {self._error}")
        if self._closed:
            raise TensorParallelError(f"the {self.what} engine was closed")
        if self._dead_workers():
            raise self._fail("worker exited")

    def _fail(self, what: str) -> TensorParallelError:
        time.sleep(0.5)  # a worker killed mid-step may need a moment to be reaped
        dead = self._dead_workers()
        tail = self._worker_errors(last_line_only=True)
        if dead:
            self._error = f"{self.what} worker {dead} died ({what}){tail}"
        else:
            self._error = (f"a {self.what} worker did not answer within {self.config.distributed_timeout_s:.0f} s "
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


class TensorParallelExecutor(MultiprocExecutor):
    """Every layer split over the ranks (shard.py); each rank runs the ordinary forward on its shard."""

    mode = TENSOR
    what = "tensor-parallel"
    check_size = staticmethod(check_tp_size)

    def _forward(self, batch: StepBatch) -> torch.Tensor | None:
        return self.runner.execute(batch)  # the all-reduces and the logits' all-gather line the ranks up

    def take_routed_tokens(self):
        """Rank 0 routes every token of every MoE layer (only the experts it runs are split): the global counts."""
        return self.runner.take_routed_tokens()


class PipelineParallelExecutor(MultiprocExecutor):
    """The layers split into stages (pipeline.py); rank 0 embeds, runs stage 0 and receives the logits."""

    mode = PIPELINE
    what = "pipeline-parallel"
    check_size = staticmethod(check_pp_size)

    def _forward(self, batch: StepBatch) -> torch.Tensor | None:
        return forward_pipeline(self.runner, batch)


def _reap(workers) -> None:
    """Last resort for an executor nobody closed: kill its workers, leave the process group."""
    for p in workers:
        if p.is_alive():
            p.kill()
        p.join(timeout=10)
    destroy_group()
