"""The machine's roofs for the roofline, from minillm.roofline (measured once, cached).

We only read the measurement (minillm.roofline.get_roofs caches it per machine);
the first call on a new machine measures for a few seconds.
"""
from __future__ import annotations

import torch

from minillm.visualize.roofline_view import Roofs


def machine_roofs(device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
                  model_config=None, prefill_rows: int = 512, remeasure: bool = False,
                  wait_quiet_s: float = 0.0) -> Roofs:
    """This machine's bandwidth roof and matmul FLOP/s for `dtype`, at the current torch thread count.

    The cache is per thread count, so the roofs judge runs made with the threads set now. With
    `model_config`, the compute roof also covers the products a `prefill_rows`-token prefill of that
    model runs, in the engine's layout (minillm.roofline.roofs.model_gemm_shapes). `remeasure`: measure
    again now instead of reading the cache (a cached roof measured at a busier moment is too low),
    first waiting up to `wait_quiet_s` for parallel ops to stop stalling (another tenant on a core).
    """
    from minillm.roofline import get_roofs
    from minillm.roofline.roofs import model_gemm_shapes

    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    extra = model_gemm_shapes(model_config, prefill_rows) if model_config is not None else ()
    kw = {"wait_quiet_s": wait_quiet_s} if wait_quiet_s else {}
    measured = get_roofs(device, remeasure=remeasure, dtypes=(name,), extra_shapes=extra, **kw)
    dev = measured.machine.get("device_name") or str(device)
    threads = measured.machine.get("torch_threads")
    where = f"{dev}, {name}" + (f", {threads} thread{'s' if threads != 1 else ''}" if threads and dev != "cuda" and "cuda" not in str(device) else "")
    return Roofs(measured.bandwidth_bytes_per_s, measured.flops_per_s(name), where)


def engine_roofs(engine) -> Roofs:
    """Roofs for the device and weight dtype an LLMEngine (or LLM) runs with."""
    engine = getattr(engine, "engine", engine)
    w = engine.model.embed_tokens.weight
    return machine_roofs(w.device, w.dtype, model_config=getattr(engine, "model_config", None))
