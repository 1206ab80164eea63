"""ModelRunner: the local executor -- this process's model, its KV pool, one packed step at a time.

    runner = ModelRunner(model, config)          # plans and allocates the pool, picks the backend
    logits = runner.execute(StepBatch.build(chunks))

A tensor-parallel rank runs the same ModelRunner on its shard (parallel/), so
`execute` is also what every worker calls on the batch rank 0 broadcasts.
"""
from __future__ import annotations

from typing import Callable

import torch

from minillm import envs
from minillm.attention.registry import make_attention_backend
from minillm.engine.batch import StepBatch
from minillm.engine.compile import frozen_compile, mark_pool_static
from minillm.engine.config import EngineConfig
from minillm.engine.cpu_decode_step import CpuDecodeStep, why_not as decode_step_why_not
from minillm.engine.cpu_memory import keep_freed_memory, release_freed_memory
from minillm.engine.cuda_graphs import DecodeGraphs
from minillm.engine.executor import Executor
from minillm.engine.few_row_panels import PanelReport, pack_panels, panels_wanted
from minillm.engine.huge_pages import HugePageReport, move_to_huge_pages
from minillm.engine.kv_cache import KVCachePlan, KVCachePool, plan_kv_cache
from minillm.kernels import prefill_attention_cpu as cpu_prefill
from minillm.models import fused
from minillm.models.llama import LlamaForCausalLM
from minillm.models.moe import RoutedTokens, moe_blocks, reset_routed_tokens, take_routed_tokens
from minillm.models.skinny_linear import use_skinny_linears
from minillm.quant.linear import QuantLinear


def use_cuda_graphs(config: EngineConfig, device: torch.device) -> bool:
    """config.cuda_graphs, where None means: on for a CUDA device unless torch.compile does the job."""
    if config.cuda_graphs is None:
        return device.type == "cuda" and not config.compile
    if config.cuda_graphs and device.type != "cuda":
        raise ValueError(f"cuda_graphs=True needs a CUDA device; this engine runs on {device.type}")
    return config.cuda_graphs


def check_moe_options(config: EngineConfig) -> None:
    """A mixture-of-experts model runs eager: its expert dispatch reads each expert's token count on the
    host every layer (models/moe.py), which a CUDA graph cannot capture and torch.compile would break on."""
    if config.compile:
        raise ValueError("compile=True is not supported for mixture-of-experts models (the expert dispatch "
                         "reads token counts on the host every layer)")
    if config.cuda_graphs:
        raise ValueError("cuda_graphs=True is not supported for mixture-of-experts models (the expert dispatch "
                         "reads token counts on the host every layer, which a graph cannot capture)")


COMPILED_BODY_ENV = envs.MINILLM_COMPILED_BODY
COMPILED_BODY_LAYOUTS = envs.COMPILED_BODY_LAYOUTS


def compiled_body_layout() -> str:
    """How a compiled float32 CPU engine stores its layers' weights: "row-major" (nn.Linear's: decode steps
    of up to 16 rows call the few-row kernel inside the graph, eager prefill chunks the tiled kernel) or
    "k-major" (inductor's own GEMV and GEMM code on transposed weights). MINILLM_COMPILED_BODY names one;
    by default the CPU decides, through the tiled kernel's start-up timing (kernels/tiled_cpu.outruns_mkl).

    Batch-1 decode is level either way (each reads every weight once, at the bus's speed). Prefill is
    not: row-major prefill runs the tiled kernel where it out-runs MKL at 512 rows, and MKL's sgemm on
    nn.Linear's layout elsewhere, which lost to K-major. Measured, two engines on two copies interleaved
    in one process: a 2-vCPU Zen 5 (the tiled kernel 1.25x MKL or more) put row-major's 1,024-token
    prefill at 953 against 1,534 ms (x1.61 paired, six runs) and its decode step level (x0.996); a
    2-vCPU Xeon, where MKL wins, put it 12-18% behind. Row-major also runs small batches faster (a few
    users, speculative verify steps: batch 8 x1.21-1.23 on the Xeon)."""
    layout = envs.compiled_body()  # ValueError for another value
    if layout is None:
        from minillm.kernels import tiled_cpu

        return "row-major" if tiled_cpu.outruns_mkl() else "k-major"  # False where the kernel did not build
    return layout


class ModelRunner(Executor):
    def __init__(self, model: LlamaForCausalLM, config: EngineConfig, plan: KVCachePlan | None = None,
                 graphs: bool | None = None) -> None:
        """graphs: decode through CUDA graphs (engine/cuda_graphs.py); None follows config.cuda_graphs.
        graphs=True on a CPU runs the graphs' buffers and padding without capture (for tests)."""
        self.model = model
        self.device = model.embed_tokens.weight.device
        self.plan = plan or plan_kv_cache(model, config, self.device)
        if self.device.type == "cpu":
            keep_freed_memory()  # a step's large activations reuse freed pages (engine/cpu_memory.py)
            fused.build_cpu_kernels()  # residual add + RMSNorm and RoPE in one pass each (models/fused.py)
            cpu_prefill.available()  # causal prefill attention in C++ (kernels/prefill_attention_cpu.py)
        if self.device.type == "cpu" and model.embed_tokens.weight.dtype == torch.float32:
            # few-row products through the few-row kernel (models/skinny_linear.py): faster decode, and
            # verify steps and small batches stop costing a decode step per row. A compiled decode step
            # calls it from its graph (SkinnyLinear._traced_forward) where its layers stay row-major
            use_skinny_linears(model)
            if config.compile and compiled_body_layout() == "k-major":
                # bf16 gains nothing from K-major at batch 1 and loses ~10% at batch 8: float32 only
                model.use_k_major_weights()
        # each decode step streams every weight once: 2 MB pages spare the page walks (engine/huge_pages.py)
        self.huge_pages = move_to_huge_pages(model) if self.device.type == "cpu" else HugePageReport("not a CPU")
        # verify steps of k + 1 rows read the body's weights again, packed in panels (engine/few_row_panels.py)
        why_not = panels_wanted(model, config)
        self.panels = PanelReport(skipped=why_not) if why_not else pack_panels(model)
        if self.device.type == "cpu":
            release_freed_memory()  # the weights' old copies, freed by the moves above, back to the OS
        self.backend = make_attention_backend(config.backend_for(self.device))
        graphs = use_cuda_graphs(config, self.device) if graphs is None else graphs
        self.moe_blocks = moe_blocks(model)
        if self.moe_blocks:
            check_moe_options(config)
            graphs = False
        self.pool = KVCachePool(model.config, self.plan, self.device, scratch_blocks=1 if graphs else 0)
        self.attach()
        self.decode_graphs: DecodeGraphs | None = None
        if graphs:
            max_len = min(config.max_model_len or model.config.max_position_embeddings, model.rotary.cos.shape[0])
            # the block after the plan's is scratch: the graphs' padding rows write their K/V there
            self.decode_graphs = DecodeGraphs(model, self.plan.block_size, max_len, config.max_num_seqs,
                                              self.plan.num_blocks, self.device, capture=self.device.type == "cuda")
            self.decode_graphs.capture()
        # decode steps of up to 16 rows as one C++ call where the model and pool allow (engine/cpu_decode_step.py);
        # built last, once the weights sit where they stay (K-major, huge pages) and the pool exists
        self.decode_step_skipped = decode_step_why_not(model, config, self.plan.quantized, self.device) if not graphs \
            else "CUDA graphs replay decode"
        if config.cpu_decode_step and self.decode_step_skipped:
            raise ValueError(f"cpu_decode_step=True, but this engine cannot run it: {self.decode_step_skipped}")
        self.decode_step = CpuDecodeStep.build(model, self.pool) if self.decode_step_skipped is None else None
        self.compiled_decode = None
        self.compiled_logits = None
        self.last_hidden: torch.Tensor | None = None  # final hidden states of the last step's logit rows
        # EAGLE's layer reads the final hidden state of every row the step ran, not only the logit rows
        self.keep_all_hidden = False
        self.last_all_hidden: torch.Tensor | None = None
        # more rows for the same LM-head product: given the logit rows' hidden states, a proposer (Medusa)
        # returns rows of its own or None; their logits land in last_extra_logits (else None)
        self.logit_extras: Callable[[torch.Tensor], torch.Tensor | None] | None = None
        self.last_extra_logits: torch.Tensor | None = None
        if config.compile:
            self.compiled_decode = frozen_compile(model.forward, cpu_wrapper=self.device.type == "cpu",
                                                  huge_pages=self.device.type == "cpu")
            mark_pool_static(self.pool.tensors())
            if isinstance(model.lm_head, QuantLinear):
                # a quantized head is fastest as an inductor-fused dequantize-and-reduce at batch 1
                self.compiled_logits = torch.compile(model.compute_logits, dynamic=True)

    def attach(self) -> None:
        self.pool.bind(self.model, self.backend)

    def take_routed_tokens(self) -> RoutedTokens | None:
        # a dense model has none: skip the walk over its layers every step
        return take_routed_tokens(self.model) if self.moe_blocks else None

    def move_kv(self, moves: list[tuple[int, int]]) -> None:
        self.pool.move_slots(moves)

    @property
    def kv_cache_bytes(self) -> int:
        return self.pool.num_bytes

    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> torch.Tensor | None:
        self.attach()
        reset_routed_tokens(self.moe_blocks)  # the step's counts are this forward's only
        dev = self.device
        if self.decode_graphs is not None and self.decode_graphs.fits(batch):
            hidden = self.decode_graphs.run(batch)  # a replay: the batch padded to its bucket
        elif self.decode_step is not None and self.decode_step.fits(batch):
            hidden = self.decode_step.run(batch)  # one C++ call, one parallel region
        else:
            meta = batch.attention_metadata(self.plan.block_size, self.device)
            forward = self.model.forward
            if self.compiled_decode is not None and batch.is_decode_only:
                forward = self.compiled_decode  # derives its decode indices in-graph
            else:
                self.backend.prepare(meta, self.plan.block_size, self.model.config.num_key_value_heads,
                                     self.plan.quantized)
            hidden = forward(torch.tensor(batch.token_ids, device=dev), torch.tensor(batch.positions, device=dev),
                             meta)
        self.last_extra_logits = None
        self.last_all_hidden = hidden[: len(batch.token_ids)] if self.keep_all_hidden else None
        if not batch.logit_rows:
            return None
        compute_logits = self.model.compute_logits
        if self.compiled_logits is not None and len(batch.logit_rows) == 1:
            compute_logits = self.compiled_logits
        # usually a run of consecutive rows (every decode row): a view, no gather -- except of a CUDA
        # graph's output, a buffer the next replay overwrites while proposers still read last_hidden
        rows = batch.logit_rows
        if self.decode_graphs is None and rows == list(range(rows[0], rows[0] + len(rows))):
            self.last_hidden = hidden[rows[0] : rows[0] + len(rows)]  # Medusa's heads read them
        else:
            self.last_hidden = hidden[torch.tensor(rows, device=dev)]
        extra = self.logit_extras(self.last_hidden) if self.logit_extras is not None else None
        if extra is None:
            return compute_logits(self.last_hidden)
        # one pass over the LM head's weights for both: at a few rows the product costs one weight read
        logits = self.model.compute_logits(torch.cat([self.last_hidden, extra.to(self.last_hidden.dtype)]))
        self.last_extra_logits = logits[len(batch.logit_rows):]
        return logits[: len(batch.logit_rows)]
