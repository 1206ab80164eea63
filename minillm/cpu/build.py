"""Build the CPU fast path's C++ kernels now: `python -m minillm.cpu.build`.

Each kernel is built once per machine, CPU and torch version (cached; kernels/gguf_cpu.build_extension),
on first use otherwise -- then the first engine waits for it. scripts/install.sh runs this where a
compiler exists, so the demo's first request does not pay for the build. A kernel that cannot be built
is reported and skipped: the engine then runs the plain code in its place.
"""
from __future__ import annotations

import sys
import time


def build_all() -> dict[str, bool]:
    from minillm.cpu.kernels import (decode_step_cpu, fused_cpu, paged_attention_cpu, panel_cpu,
                                     prefill_attention_cpu, skinny_cpu, tiled_cpu)

    kernels = {"fused elementwise": fused_cpu, "paged attention": paged_attention_cpu,
               "prefill attention": prefill_attention_cpu, "few-row products": skinny_cpu,
               "tiled products": tiled_cpu, "panels": panel_cpu, "one-region decode step": decode_step_cpu}
    return {name: bool(module.available()) for name, module in kernels.items()}


def main() -> int:
    start = time.perf_counter()
    built = build_all()
    ok = [name for name, done in built.items() if done]
    missing = [name for name, done in built.items() if not done]
    print(f"minillm: CPU fast path kernels ready in {time.perf_counter() - start:.1f} s ({', '.join(ok) or 'none'})"
          + (f"; not built here: {', '.join(missing)} (the plain code runs in their place)" if missing else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
