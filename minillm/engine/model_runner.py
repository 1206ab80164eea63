"""ModelRunner: the local executor -- this process's model, its KV pool, one packed step at a time.

    runner = ModelRunner(model, config)          # plans and allocates the pool, picks the backend
    logits = runner.execute(StepBatch.build(chunks))

A tensor-parallel rank runs the same ModelRunner on its shard (parallel/), so
`execute` is also what every worker calls on the batch rank 0 broadcasts.
"""
from __future__ import annotations

from typing import Callable

import torch

from minillm.attention.registry import make_attention_backend
from minillm.engine.batch import StepBatch
from minillm.engine.config import EngineConfig
from minillm.engine.executor import Executor
from minillm.engine.fast_path import COMPILED, CUDA_GRAPH, PLAIN, StepRunner, choose_fast_path
from minillm.engine.kv_cache import KVCachePlan, KVCachePool, plan_kv_cache
from minillm.models.llama import LlamaForCausalLM


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


class ModelRunner(Executor):
    def __init__(self, model: LlamaForCausalLM, config: EngineConfig, plan: KVCachePlan | None = None,
                 graphs: bool | None = None) -> None:
        """graphs: decode through CUDA graphs (engine/cuda_graphs.py); None follows config.cuda_graphs.
        graphs=True on a CPU runs the graphs' buffers and padding without capture (for tests)."""
        self.model = model
        self.device = model.embed_tokens.weight.device
        self.plan = plan or plan_kv_cache(model, config, self.device)
        # an optional fast path (engine/fast_path.py) may change the model in place now -- weight layouts,
        # module swaps -- and offer its own attention backend and whole-step runner below
        self.fast_path, self.fast_path_report = choose_fast_path(model, config, self.device)
        if self.fast_path is not None:
            self.fast_path_report.choices = self.fast_path.prepare(model, config, self.device)
        self.fast_argmax = self.fast_path.greedy if self.fast_path is not None else None
        backend = config.backend_for(self.device)
        self.backend = (self.fast_path and self.fast_path.attention_backend(backend)) or make_attention_backend(backend)
        graphs = use_cuda_graphs(config, self.device) if graphs is None else graphs
        self.moe_blocks = []  # a mixture-of-experts model's routed blocks (models/moe.py)
        if model.config.is_moe:
            from minillm.models.moe import moe_blocks

            self.moe_blocks = moe_blocks(model)
        if self.moe_blocks:
            check_moe_options(config)
            graphs = False
        self.pool = KVCachePool(model.config, self.plan, self.device, scratch_blocks=1 if graphs else 0)
        self.attach()
        self.decode_graphs = None  # engine/cuda_graphs.DecodeGraphs where graphs run
        if graphs:
            from minillm.engine.cuda_graphs import DecodeGraphs

            max_len = min(config.max_model_len or model.config.max_position_embeddings, model.rotary.cos.shape[0])
            # the block after the plan's is scratch: the graphs' padding rows write their K/V there
            self.decode_graphs = DecodeGraphs(model, self.plan.block_size, max_len, config.max_num_seqs,
                                              self.plan.num_blocks, self.device, capture=self.device.type == "cuda")
            self.decode_graphs.capture()
        # whole steps in one call where the fast path has a runner for them (built last, once the
        # weights sit where they stay and the pool exists)
        self.step_runner: StepRunner | None = None
        if self.fast_path is not None:
            self.step_runner = self.fast_path.step_runner(model, self.pool, config, graphs)
        self.last_path = PLAIN  # which path ran the last step (the trace records it)
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
            from minillm.engine.compile import frozen_compile, mark_pool_static

            fast = self.fast_path
            self.compiled_decode = frozen_compile(model.forward, cpu_wrapper=self.device.type == "cpu",
                                                  on_new_constants=fast.on_compiled_weights if fast else None,
                                                  options=fast.compile_options() if fast else None)
            mark_pool_static(self.pool.tensors())
            from minillm.quant.linear import QuantLinear

            if isinstance(model.lm_head, QuantLinear):
                # a quantized head is fastest as an inductor-fused dequantize-and-reduce at batch 1
                self.compiled_logits = torch.compile(model.compute_logits, dynamic=True)

    def attach(self) -> None:
        self.pool.bind(self.model, self.backend)

    def release_kv_cache(self) -> None:
        self.step_runner = None  # it may hold the pool's tensors too
        self.pool.release()

    def take_routed_tokens(self):
        if not self.moe_blocks:  # a dense model has none: skip the walk over its layers every step
            return None
        from minillm.models.moe import take_routed_tokens

        return take_routed_tokens(self.model)

    def move_kv(self, moves: list[tuple[int, int]]) -> None:
        self.pool.move_slots(moves)

    @property
    def kv_cache_bytes(self) -> int:
        return self.pool.num_bytes

    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> torch.Tensor | None:
        self.attach()
        if self.moe_blocks:
            from minillm.models.moe import reset_routed_tokens

            reset_routed_tokens(self.moe_blocks)  # the step's counts are this forward's only
        dev = self.device
        if self.decode_graphs is not None and self.decode_graphs.fits(batch):
            hidden, self.last_path = self.decode_graphs.run(batch), CUDA_GRAPH  # a replay, padded to its bucket
        elif self.step_runner is not None and self.step_runner.fits(batch):
            hidden, self.last_path = self.step_runner.run(batch), self.step_runner.name
        else:
            meta = batch.attention_metadata(self.plan.block_size, self.device)
            forward, self.last_path = self.model.forward, PLAIN
            if self.compiled_decode is not None and batch.is_decode_only:
                forward, self.last_path = self.compiled_decode, COMPILED  # derives its decode indices in-graph
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
