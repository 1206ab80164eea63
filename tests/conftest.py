"""Shared fixtures. Loading the default model is the expensive part: once per session."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# Tests import shared builders as `tests.helpers...`; make the checkout root importable
# however pytest was started (`pytest`, `python -m pytest`, from another directory).
# (`pythonpath = ["."]` under [tool.pytest.ini_options] would do the same.)
ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# int8/int4 layers: one route for the whole suite, so the quantization tests keep one set of expected
# layouts, byte counts and agreement bounds on every CPU. The default differs by CPU (bf16 hardware:
# torch's bf16 kernels; none: the GGUF block kernels, minillm/quant/cpu_route.py); the block route is
# tested explicitly in tests/test_quant_cpu_route.py (its kernels, the default model on it, the choice).
# The notebooks (run by tests/test_notebooks.py in a child process) take the route a reader's machine
# takes, so the pin is marked as the suite's own and dropped there.
if "MINILLM_QUANT_CPU_ROUTE" not in os.environ:
    os.environ["MINILLM_QUANT_CPU_ROUTE"] = "bf16"
    os.environ["MINILLM_TESTS_PINNED_ROUTE"] = "1"


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (scripts/test.sh runs one worker per CPU) give each worker its own share of the
    CPUs, so two workers' torch thread pools never fight over one core; the processes a test starts
    (TP ranks, servers, notebook kernels) inherit the share."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    share = set(cpus[int(worker[2:]) % count::count])
    if share:
        os.sched_setaffinity(0, share)
        torch.set_num_threads(len(share))


_pin_xdist_worker()

# Without a GPU the Triton kernels run under the interpreter, which must be switched on before
# anything imports triton -- torch.compile does (test_engine_compile runs before the Triton tests).
import minillm.kernels  # noqa: E402,F401  (sets TRITON_INTERPRET=1 unless a GPU is present or it is set)


@pytest.fixture(scope="session")
def default_model():
    """minillm's LoadedModel of the default GGUF (SmolLM2-135M-Instruct), float32, CPU."""
    from minillm.loader import load_model

    return load_model(dtype=torch.float32)


@pytest.fixture(scope="session")
def hf_default_reference():
    """transformers' own load of the same GGUF (it dequantizes too): our logits reference."""
    from transformers import AutoModelForCausalLM

    from minillm.loader import default_model_path

    path = Path(default_model_path())
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's timed runs: on a shared 2-core machine a busy core stalls
    every 2-thread op by ~12 ms. Use with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="module", autouse=True)
def _release_freed_memory_after_each_module():
    """Each module's models, once freed, go back to the OS: a worker runs many modules, and glibc keeps
    freed heap memory for reuse (minillm/cpu/memory.py), so two workers' leftovers plus a module loading
    a 1.5B float32 model ran the 24 GB machine out of memory."""
    yield
    import gc

    from minillm.cpu.memory import release_freed_memory

    gc.collect()
    release_freed_memory()
