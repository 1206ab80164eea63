"""Build and load the one-region decode step (minillm/cpu/kernels/decode_step.cpp) for this CPU.

A float32 Llama-family decode step of up to 16 rows as one C++ call: the thread team forks once per
step and meets at a barrier between ops, instead of forking and joining (and returning to Python or
to a compiled graph's wrapper) for each of the step's ~300 calls. minillm/cpu/decode_step.py
decides when an engine uses it. Built like the GGUF kernels (same flags, same cache folder;
``ATEN_CPU_CAPABILITY`` selects the instruction set). ``MINILLM_DECODE_STEP=ops`` turns it off.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from minillm import envs
from minillm.cpu.kernels import gguf_cpu

SOURCE = Path(__file__).with_name("decode_step.cpp")
MAX_ROWS = 16  # decode_step.cpp MAX_BATCH


def load():
    """The DecodeStep class (torch.classes.minillm_step.DecodeStep), or GGUFKernelUnavailable with the reason."""
    gguf_cpu.build_and_load(SOURCE, "minillm_step")
    return torch.classes.minillm_step.DecodeStep


@functools.cache
def available() -> bool:
    """Build/load once; False where the build fails or MINILLM_DECODE_STEP=ops (the step then runs op by op)."""
    return gguf_cpu.loads_unless_turned_off(envs.MINILLM_DECODE_STEP, "ops", load,
                                            "one-region CPU decode step unavailable, running decode op by op")
