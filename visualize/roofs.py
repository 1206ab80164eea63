"""The machine's roofs for the roofline, from minillm.roofline (measured once, cached).

We only read the measurement (minillm.roofline.get_roofs caches it per machine);
the first call on a new machine measures for a few seconds.
"""
from __future__ import annotations

import torch

from minillm.visualize.roofline_view import Roofs


def machine_roofs(device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32") -> Roofs:
    """This machine's bandwidth roof and matmul FLOP/s for `dtype`, at the current torch thread count.

    The cache is per thread count, so the roofs judge runs made with the threads set now.
    """
    from minillm.roofline import get_roofs

    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    measured = get_roofs(device, dtypes=(name,))
    dev = measured.machine.get("device_name") or str(device)
    threads = measured.machine.get("torch_threads")
    where = f"{dev}, {name}" + (f", {threads} thread{'s' if threads != 1 else ''}" if threads and dev != "cuda" and "cuda" not in str(device) else "")
    return Roofs(measured.bandwidth_bytes_per_s, measured.flops_per_s(name), where)


def engine_roofs(engine) -> Roofs:
    """Roofs for the device and weight dtype an LLMEngine (or LLM) runs with."""
    engine = getattr(engine, "engine", engine)
    w = engine.model.embed_tokens.weight
    return machine_roofs(w.device, w.dtype)
