"""Rank 0's executor when torchrun started the ranks: the workers are the other already-running processes.

The step is the local executor's (executor.py): broadcast the StepBatch, run the same forward on
every rank, rank 0 gets the logits. What differs is life and death, because rank 0 did not start
its workers and cannot see their processes (they may be on other machines):

    start   join the group through torchrun's env:// rendezvous; broadcast the EngineConfig; one
            all-gather of "loaded" or a traceback stands in for the local start-up queue, under
            distributed_startup_timeout_s; then the group's timeout drops to distributed_timeout_s
    health  only what the collectives say: gloo raises when a peer's socket closes (a killed rank,
            at once) or when a wait outlasts distributed_timeout_s (a hung rank)
    failure rank 0 leaves the group, which closes its sockets, so every worker still waiting on it
            fails at once too and exits with its own one-line error (torchrun.run_worker_rank)
    close   broadcast None: every worker leaves its loop and exits 0
"""
from __future__ import annotations

import weakref
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.distributed_c10d import _set_pg_timeout

from minillm.engine.config import EngineConfig
from minillm.engine.kv_cache import plan_kv_cache
from minillm.engine.model_runner import ModelRunner
from minillm.parallel import comm
from minillm.parallel.executor import (MultiprocExecutor, PipelineParallelExecutor, TensorParallelError,
                                       TensorParallelExecutor)
from minillm.parallel.group import destroy_group, init_group
from minillm.parallel.torchrun import LOADED, check_world_size, torchrun_env
from minillm.parallel.worker import shard_for


class TorchrunRank0:
    """Mixed in before a MultiprocExecutor subclass: its step, with ranks torchrun started."""

    def __init__(self, model, config: EngineConfig) -> None:
        env = torchrun_env()
        if env is None:
            raise RuntimeError("not launched by torchrun with WORLD_SIZE > 1")
        check_world_size(env, config.tensor_parallel_size, config.pipeline_parallel_size)
        if env.rank != 0:
            raise RuntimeError(
                f"this is rank {env.rank} of a torchrun launch: only rank 0 builds the engine; the other ranks "
                "serve its steps (minillm.parallel.torchrun.run_worker_rank, which `python -m minillm` calls)")
        self.check_size(model.config, config.world_size)
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed process group already exists in this process: "
                               "one parallel engine per process at a time")
        self.config, self.size = config, config.world_size
        self._error: str | None = None
        self._closed = False
        self.workers: list = []  # torchrun's, not ours: nothing to join or kill here
        self.start_method, self._start_why = "torchrun", "ranks started by torchrun"
        device = model.embed_tokens.weight.device
        # until every rank has loaded, the wait is for the slowest load, not for one step
        init_group(0, self.size, None, device, config.distributed_startup_timeout_s)
        self._finalizer = weakref.finalize(self, shutdown_workers)
        try:
            dist.broadcast_object_list([(config, device.type)], src=0)
            shard_for(self.mode)(model, 0, self.size)
            statuses: list = [None] * self.size
            dist.all_gather_object(statuses, LOADED)
            failed = {r: s for r, s in enumerate(statuses) if s != LOADED}
            if failed:
                raise TensorParallelError(f"{self.what} rank(s) {sorted(failed)} failed to load the model:\n"
                                          + "\n".join(f"rank {r}: {s}" for r, s in failed.items()))
            _set_pg_timeout(timedelta(seconds=config.distributed_timeout_s))
            self.plan = plan_kv_cache(model, config, device)
            dist.broadcast_object_list([self.plan.num_blocks], src=0)
            self.runner = ModelRunner(model, config, self.plan)
        except RuntimeError as e:
            destroy_group()
            self._finalizer.detach()
            if isinstance(e, TensorParallelError):
                raise
            raise TensorParallelError(f"the {self.what} ranks did not all start (within "
                                      f"{config.distributed_startup_timeout_s:.0f} s?): {e}") from e
        except BaseException:
            destroy_group()
            self._finalizer.detach()
            raise
        self.device = self.runner.device
        comm.STATS.take()

    # ----- health: the collectives are all rank 0 can see of the other ranks ---------------------
    def _dead_workers(self) -> str:
        return ""

    def _worker_errors(self, last_line_only: bool = False) -> str:
        return ""

    def _kill_workers(self) -> None:
        """Leave the group: rank 0's sockets close, so every worker waiting on it fails at once and exits."""
        destroy_group()

    def _fail(self, what: str) -> TensorParallelError:
        who = "rank 1" if self.size == 2 else f"one of ranks 1..{self.size - 1}"
        if "timed out" in what.lower():  # gloo: "Timed out waiting ...ms for recv"
            self._error = (f"{self.what} {who} (started by torchrun) did not answer within "
                           f"{self.config.distributed_timeout_s:.0f} s: hung, or its node unreachable ({what})")
        else:
            self._error = (f"{self.what} {who} (started by torchrun) closed its connection: the process died or "
                           f"its node went away; torchrun's summary and that rank's log say why ({what})")
        self._kill_workers()
        return TensorParallelError(self._error)

    def close(self) -> None:
        """Tell the worker ranks to stop (they exit 0), leave the group."""
        if self._closed:
            return
        self._closed = True
        if self._error is None:
            shutdown_workers()
        destroy_group()
        self._finalizer.detach()


class TorchrunTensorParallelExecutor(TorchrunRank0, TensorParallelExecutor):
    """Tensor parallelism over ranks torchrun started."""


class TorchrunPipelineParallelExecutor(TorchrunRank0, PipelineParallelExecutor):
    """Pipeline parallelism over ranks torchrun started."""


def make_torchrun_executor(model, config: EngineConfig) -> MultiprocExecutor:
    if config.pipeline_parallel_size > 1:
        return TorchrunPipelineParallelExecutor(model, config)
    return TorchrunTensorParallelExecutor(model, config)


def shutdown_workers() -> None:
    """The shutdown broadcast (None), then leave the group; also at exit for an engine nobody closed."""
    if dist.is_initialized():
        try:
            dist.broadcast_object_list([None], src=0)
        except RuntimeError:  # a worker already gone: nothing left to tell
            pass
    destroy_group()
