"""How a parallel engine starts: this process starts its workers, or torchrun started the ranks.

    make_parallel_executor(model, config)   the engine's executor for world_size > 1 (LLMEngine calls it)
    add_parallel_args(parser)               --tensor-parallel-size / --pipeline-parallel-size of a command
    run_command(env, command, tp, pp)       a CLI command under torchrun: rank 0 runs it, the others serve

Above both ways (executor.py: local workers; torchrun.py and torchrun_executor.py: torchrun's ranks),
which therefore import neither this module nor each other's start-up. Each function imports what it
runs, so a command's parser (add_parallel_args) loads no torch.distributed.
"""
from __future__ import annotations

import argparse
import gc
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from minillm.engine.config import EngineConfig
    from minillm.parallel.executor import MultiprocExecutor
    from minillm.parallel.torchrun import TorchrunEnv


def make_parallel_executor(model, config: EngineConfig) -> MultiprocExecutor:
    """The executor for config's tensor_parallel_size or pipeline_parallel_size (> 1; they do not combine).

    Under torchrun (WORLD_SIZE > 1) the workers are the ranks torchrun started (torchrun_executor.py);
    otherwise this process starts them (executor.py)."""
    from minillm.parallel.torchrun import torchrun_env

    if torchrun_env() is not None:
        from minillm.parallel.torchrun_executor import make_torchrun_executor

        return make_torchrun_executor(model, config)
    from minillm.parallel.executor import PipelineParallelExecutor, TensorParallelExecutor

    if config.pipeline_parallel_size > 1:
        return PipelineParallelExecutor(model, config)
    if config.tensor_parallel_size > 1:
        return TensorParallelExecutor(model, config)
    raise ValueError("make_parallel_executor needs tensor_parallel_size or pipeline_parallel_size > 1")


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    """Shared by `minillm` and `minillm serve`: the model split over processes (local workers, or torchrun's ranks)."""
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="split every layer over N processes (under torchrun: its WORLD_SIZE)")
    p.add_argument("--pipeline-parallel-size", type=int, default=1,
                   help="split the layers into N stages, one per process (not combined with tensor parallel)")


def run_command(env: TorchrunEnv | None, command: Callable[[], int], tensor_parallel_size: int,
                pipeline_parallel_size: int) -> int:
    """Run a CLI command that builds an LLM: as before without torchrun. Under torchrun: on rank 0 with
    a one-line error when the group breaks, on any other rank the worker loop; then the process ends
    here (exit_rank)."""
    if env is None:
        return command()
    from minillm.parallel.torchrun import check_world_size, exit_rank, run_worker_rank, say
    from minillm.parallel.worker import dump_stacks_on_sigusr1

    try:
        check_world_size(env, tensor_parallel_size, pipeline_parallel_size)
    except ValueError as e:
        say(env, str(e))
        exit_rank(2)
    if env.rank != 0:
        exit_rank(run_worker_rank(env))
    from minillm.parallel.executor import TensorParallelError
    from minillm.parallel.torchrun_executor import shutdown_workers

    dump_stacks_on_sigusr1()  # `kill -USR1 <pid>` shows where a stuck rank 0 waits, as on the workers
    try:
        code = command()
    except TensorParallelError as e:
        say(env, f"error: {e}")
        code = 1
    gc.collect()  # an LLM the command left in a reference cycle: its executor's finalizer runs now
    shutdown_workers()  # (nothing to do if the engine was closed or collected)
    exit_rank(code)
