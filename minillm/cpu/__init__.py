"""The CPU fast path: the plain engine, with C++ kernels where a CPU's eager PyTorch is slow.

One plug-in (`CpuFastPath`) through the core's fast-path interface (engine/fast_path.py):

    prepare             memory: freed pages kept, then handed back (memory.py)
                        elementwise layers in C++: norms, RoPE, SiLU x up (layers.py)
                        few-row products in C++ (skinny_linear.py), K-major weights for a compiled
                        step where the tiled kernel loses to MKL (`compiled_body_layout`)
                        weights on 2 MB pages (huge_pages.py); panels for verify steps (panels.py)
    attention_backend   the torch backend with paged decode and causal prefill in C++ (attention.py)
    step_runner         a whole float32 decode step in one parallel region (decode_step.py)
    greedy              each row's argmax by the threads that wrote its logits
    compile_options     a compiled graph calls the C++ kernels as C functions (compiled_calls.py)
    on_compiled_weights a compiled graph's own weight copies on 2 MB pages too

The C++ sources and their loaders live in kernels/. Each is built once per machine and CPU
(cached; minillm/cpu/kernels/gguf_cpu.build_extension); a kernel that cannot be built leaves its
step to the plain code, with one warning that says why.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minillm import envs
from minillm.engine.fast_path import FastPath, StepRunner


# Below this many quantized bytes gguf-py takes ~1 s and a first kernel build (~20 s, once per machine) is
# not worth it
FAST_DEQUANT_MIN_BYTES = 256 << 20


def compiled_body_layout() -> str:
    """How a compiled float32 CPU engine stores its layers' weights: "row-major" (nn.Linear's: decode steps
    of up to 16 rows call the few-row kernel inside the graph, eager prefill chunks the tiled kernel) or
    "k-major" (inductor's own GEMV and GEMM code on transposed weights). MINILLM_COMPILED_BODY names one;
    by default the CPU decides, through the tiled kernel's start-up timing (kernels/tiled_cpu.outruns_mkl),
    which the engine records (FastPathReport.choices).

    Batch-1 decode is level either way (each reads every weight once, at the bus's speed). Prefill is
    not: row-major prefill runs the tiled kernel where it out-runs MKL at 512 rows, and MKL's sgemm on
    nn.Linear's layout elsewhere, which lost to K-major (book/results.md has the measurements)."""
    layout = envs.compiled_body()  # ValueError for another value
    if layout is None:
        from minillm.cpu.kernels import tiled_cpu

        return "row-major" if tiled_cpu.outruns_mkl() else "k-major"  # False where the kernel did not build
    return layout


@torch.no_grad()
def use_k_major_weights(model: nn.Module) -> None:
    """Store the body's matmul weights transposed in memory (still seen as [out, in]).

    At batch 1 each linear is a matrix-vector product that streams the weight once; inductor's code
    reads a K-major weight faster than the row-major one nn.Linear uses, while batched matmuls run the
    same. Values, shapes and names are unchanged. The embedding and the LM head keep their layout: a
    lookup reads whole rows, and the head runs outside the compiled step, where the few-row kernel
    reads a row-major weight fastest."""
    for module in model.layers.modules():
        if isinstance(module, nn.Linear) and module.weight.is_contiguous():
            module.weight = nn.Parameter(module.weight.t().contiguous().t(), requires_grad=False)


class CpuFastPath(FastPath):
    name = "cpu"

    def __init__(self) -> None:
        # what prepare() and step_runner() did, for the engine's report and for tests
        self.huge_pages: Any = None
        self.panels: Any = None
        self.decode_step_skipped: str | None = "not built"

    def why_not(self, model: nn.Module, config, device: torch.device) -> str | None:
        if device.type != "cpu":
            return f"not a CPU ({device.type})"
        from minillm.cpu.kernels import fused_cpu

        # the first kernel builds now (once per machine); where it cannot, none will: the plain path runs
        if not fused_cpu.available():
            return "its C++ kernels could not be built here (the warning above says why)"
        return None

    def prepare(self, model: nn.Module, config, device: torch.device) -> dict[str, Any]:
        from minillm.cpu.huge_pages import move_to_huge_pages
        from minillm.cpu.kernels import fused_cpu, prefill_attention_cpu
        from minillm.cpu.layers import swap_layers
        from minillm.cpu.memory import keep_freed_memory, release_freed_memory
        from minillm.cpu.panels import PanelReport, pack_panels, panels_wanted
        from minillm.cpu.skinny_linear import use_skinny_linears

        choices: dict[str, Any] = {"malloc": keep_freed_memory()}  # a step's activations reuse freed pages
        # why_not built the elementwise kernels already
        choices["fused_layers"] = swap_layers(model) if envs.fused_kernels() and fused_cpu.ready() else 0
        prefill_attention_cpu.available()  # built now, so no step waits for it
        if model.embed_tokens.weight.dtype == torch.float32:
            # few-row products through the few-row kernel: faster decode, and verify steps and small
            # batches stop costing a decode step per row
            choices["skinny_linears"] = use_skinny_linears(model)
            if config.compile:
                # bf16 gains nothing from K-major at batch 1 and loses ~10% at batch 8: float32 only
                choices["compiled_body_layout"] = layout = compiled_body_layout()
                if layout == "k-major":
                    use_k_major_weights(model)
        self.huge_pages = move_to_huge_pages(model)  # each decode step streams every weight once
        choices["huge_pages"] = str(self.huge_pages)
        why_not = panels_wanted(model, config)  # verify steps read the body's weights again, in panels
        self.panels = PanelReport(skipped=why_not) if why_not else pack_panels(model)
        choices["panels"] = str(self.panels)
        release_freed_memory()  # the weights' old copies, freed by the moves above, back to the OS
        return choices

    def attention_backend(self, name: str):
        if name != "torch":
            return None
        from minillm.cpu.attention import CpuAttentionBackend

        return CpuAttentionBackend()

    def step_runner(self, model: nn.Module, pool, config, graphs: bool) -> StepRunner | None:
        from minillm.cpu.decode_step import CpuDecodeStep, why_not

        device = model.embed_tokens.weight.device
        self.decode_step_skipped = why_not(model, config, pool.plan.quantized, device) if not graphs \
            else "CUDA graphs replay decode"
        if config.cpu_decode_step and self.decode_step_skipped:
            raise ValueError(f"cpu_decode_step=True, but this engine cannot run it: {self.decode_step_skipped}")
        return CpuDecodeStep.build(model, pool) if self.decode_step_skipped is None else None

    def gguf_dequantizer(self, block_bytes: int):
        """torch.ops.minillm_gguf.dequantize for a big file (~20x gguf-py's numpy: a 1.5B Q4_K_M file loads
        in under 2 s instead of 35 s), built here once per machine; a small one (the default model) loads
        through gguf-py without compiling anything."""
        if envs.gguf_int4() or block_bytes < FAST_DEQUANT_MIN_BYTES:  # int4: the portable route end to end
            return None
        from minillm.cpu.kernels import gguf_cpu

        ok, _ = gguf_cpu.available()
        return torch.ops.minillm_gguf.dequantize if ok else None

    def greedy(self, logits: torch.Tensor) -> torch.Tensor | None:
        """Each float32 row's argmax by the threads that wrote it as the LM head's product: torch's max(-1)
        fetches the other core's half of fresh logits (book/results.md: 128 rows of 49,152, 2.6 against
        9.1 ms on a 2-vCPU Xeon)."""
        from minillm.cpu.kernels import skinny_cpu

        return skinny_cpu.greedy(logits) if skinny_cpu.greedy_applies(logits) else None

    def compile_options(self) -> dict[str, Any]:
        """A compiled graph's C++ wrapper calls the few-row product and the paged attention as C functions."""
        from minillm.cpu.compiled_calls import direct_calls

        return {"aot_inductor.custom_ops_to_c_shims": direct_calls()}

    def on_compiled_weights(self, tensors: list[torch.Tensor]) -> Any:
        """A compiled graph's own packed weights (inductor copies them): 2 MB pages too, in place."""
        from minillm.cpu.huge_pages import collapse_into_huge_pages, huge_pages_enabled

        return collapse_into_huge_pages(tensors) if huge_pages_enabled() else None
