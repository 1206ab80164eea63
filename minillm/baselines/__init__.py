"""The systems the engine's techniques replaced, run for real so the course can measure them.

static_batcher.py: static batching on the real engine (prompts padded to the batch's longest;
finished rows kept until the batch's longest ends).
The contiguous KV reservations are an engine mode: EngineConfig(kv_allocator="contiguous"),
engine/contiguous_block_manager.py.
"""
from minillm.baselines.static_batcher import StaticRun, run_static

__all__ = ["StaticRun", "run_static"]
