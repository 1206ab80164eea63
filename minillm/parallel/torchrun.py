"""Ranks started by `torchrun` instead of by the engine: multi-node tensor / pipeline parallelism.

    # node 0 (serves)                                  # node 1
    torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr HOST0 --master-port 29500 \\
        -m minillm serve --tensor-parallel-size 2      # the same command with --node-rank 1

Every process runs the same `python -m minillm ...` command line. Rank 0 runs the command (its
LLM gets a TorchrunExecutor, torchrun_executor.py, whose workers are the other ranks); every other
rank parses the same arguments, checks the world size, and enters the worker loop here instead:

    join the group (env://: torchrun's RANK, WORLD_SIZE, MASTER_ADDR/PORT)
    receive rank 0's EngineConfig              one source of truth: model, dtype, KV settings
    load the model, keep its shard / stage     (the model path must exist on every node)
    all-gather "loaded" or the traceback       rank 0 fails with the worker's traceback
    worker.serve_steps                         the same step loop the local workers run

A script of your own under torchrun does the same:
`if torchrun_env() and torchrun_env().rank != 0: raise SystemExit(run_worker_rank(torchrun_env()))`.
Under torchrun with WORLD_SIZE=1 nothing changes: the engine starts local workers as before.
"""
from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from typing import Mapping, NoReturn

import torch
import torch.distributed as dist

from minillm.parallel.worker import WORKER_TIMEOUT_S, PIPELINE, TENSOR, dump_stacks_on_sigusr1, serve_steps, shard_for

LOADED = "loaded"  # what a worker rank contributes to the startup all-gather when its shard is ready


@dataclass(frozen=True)
class TorchrunEnv:
    """This process's place in a torchrun launch (torchrun's environment variables)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    def device(self) -> torch.device:
        """One GPU per process on each node (cuda:LOCAL_RANK) when there are GPUs, else the CPU."""
        return torch.device(f"cuda:{self.local_rank}") if torch.cuda.is_available() else torch.device("cpu")


def torchrun_env(environ: Mapping[str, str] | None = None) -> TorchrunEnv | None:
    """The torchrun launch this process is part of, or None (not launched by torchrun, or one process).

    torchrun (torch.distributed.run) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
    (env:// rendezvous) and TORCHELASTIC_RUN_ID; RANK + WORLD_SIZE + MASTER_ADDR is what env:// needs.
    """
    env = os.environ if environ is None else environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return None
    world = int(env["WORLD_SIZE"])
    if world < 2:  # one process: the ordinary path (local workers, if any) applies
        return None
    return TorchrunEnv(int(env["RANK"]), world, int(env.get("LOCAL_RANK", 0)),
                       int(env.get("LOCAL_WORLD_SIZE", 1)))


def check_world_size(env: TorchrunEnv, tensor_parallel_size: int, pipeline_parallel_size: int) -> None:
    """ValueError unless torchrun started exactly the processes the model is split over."""
    want = tensor_parallel_size * pipeline_parallel_size  # (they do not combine: one of them is 1)
    if env.world_size != want:
        raise ValueError(
            f"torchrun started {env.world_size} processes (WORLD_SIZE), but --tensor-parallel-size "
            f"{tensor_parallel_size} x --pipeline-parallel-size {pipeline_parallel_size} = {want}; "
            f"make nnodes x nproc-per-node equal that product")


def say(env: TorchrunEnv, message: str) -> None:
    """One line on stderr naming the rank: torchrun interleaves every local rank's output."""
    print(f"minillm rank {env.rank}/{env.world_size}: {message}", file=sys.stderr, flush=True)


def run_worker_rank(env: TorchrunEnv) -> int:
    """A rank != 0: serve rank 0's steps until it shuts down (0) or the group breaks (1, said on stderr)."""
    from minillm.loader import load_model
    from minillm.parallel.group import destroy_group, init_group

    dump_stacks_on_sigusr1()
    device = env.device()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's object collectives use the current device
    stage = "joining the process group"
    try:
        # the workers wait on rank 0 for as long as the front end idles; rank 0's own, short
        # timeout catches a hung worker, and rank 0's death closes the sockets we wait on
        init_group(env.rank, env.world_size, None, device, WORKER_TIMEOUT_S)
        stage = "receiving rank 0's engine config"
        box = [None]
        dist.broadcast_object_list(box, src=0)
        config, rank0_device_type = box[0]
        if rank0_device_type != device.type:
            raise RuntimeError(f"rank 0 runs on {rank0_device_type}, this rank on {device.type}: "
                               "every rank needs the same kind of device")
        mode = PIPELINE if config.pipeline_parallel_size > 1 else TENSOR
        stage = "loading the model"
        status, model = LOADED, None
        try:
            if config.worker_threads:
                torch.set_num_threads(config.worker_threads)
            loaded = load_model(config.model, dtype=config.torch_dtype, device=device)
            model = shard_for(mode)(loaded.model.eval(), env.rank, config.world_size)
            del loaded
        except Exception:  # rank 0 shows it; every rank then stops
            status = traceback.format_exc()
        statuses: list = [None] * env.world_size
        dist.all_gather_object(statuses, status)
        failed = [r for r, s in enumerate(statuses) if s != LOADED]
        if failed:
            say(env, f"stopping: rank(s) {failed} could not start" + ("" if status == LOADED else f"\n{status}"))
            return 1
        stage = "serving rank 0's steps"
        serve_steps(mode, model, config, device)
        return 0
    except Exception as e:
        text = str(e).strip()
        # gloo raises a plain RuntimeError naming itself when a peer closed its sockets or a wait timed out
        if isinstance(e, dist.DistError) or "gloo" in text or "NCCL" in text:
            say(env, f"{stage} failed: rank 0 or another rank stopped or is unreachable; this rank exits "
                     f"({type(e).__name__}: {text.splitlines()[0] if text else ''})")
        else:  # this rank's own failure: the whole story (rank 0 then sees its connection close)
            say(env, f"{stage} failed on this rank; it exits:\n{traceback.format_exc()}")
        return 1
    finally:
        destroy_group()


def exit_rank(code: int) -> NoReturn:
    """End a torchrun rank as multiprocessing ends a local worker: os._exit, no interpreter teardown.

    Seen here (1 run in ~10, core dump): gloo's runLoop thread released the last broadcast's work,
    whose tensor holds a Python object, while the main thread was already in Py_FinalizeEx; taking
    the GIL then ends the thread by a forced unwind through a noexcept destructor: std::terminate,
    SIGABRT, and torchrun's agent on the other node waits out its exit barrier (300 s).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
