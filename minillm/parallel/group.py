"""Process-group setup: gloo on CPU, NCCL on CUDA; a free localhost port or torchrun's env."""
from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist


def backend_for(device: torch.device) -> str:
    """NCCL moves CUDA tensors GPU to GPU; gloo is the CPU (and fallback) backend."""
    return "nccl" if device.type == "cuda" else "gloo"


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(rank: int, world_size: int, port: int | None, device: torch.device, timeout_s: float) -> None:
    """Join the default process group.

    port=None reads torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT);
    otherwise every rank meets on tcp://127.0.0.1:port. timeout_s bounds how long
    this rank waits in any collective, so a dead or hung peer becomes an error.
    """
    if dist.is_initialized():
        raise RuntimeError(
            "a torch.distributed process group already exists in this process: one tensor-parallel "
            "engine per process at a time (close() the other LLM first)"
        )
    init = "env://" if port is None else f"tcp://127.0.0.1:{port}"
    dist.init_process_group(
        backend_for(device), init_method=init, rank=rank, world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
