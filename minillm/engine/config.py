"""EngineConfig: every knob of the engine, its default and its validation, in one place.

Names follow vLLM's engine arguments, so `LLM(max_num_seqs=64, block_size=16)`
means what it means there. `LLM(**kwargs)` builds one of these; `LLMEngine`,
the executors and the worker processes all read the same object.

    cfg = EngineConfig(max_num_seqs=8, num_kv_blocks=64, kv_cache_dtype="int8")
    cfg.validate()  # also run by __post_init__: a bad value fails before any model loads
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import torch

from minillm import envs
from minillm.engine.block_manager import HASH_ALGOS as PREFIX_HASH_ALGOS, PREFIX_CACHES
from minillm.engine.policy import SCHEDULING_POLICIES

if TYPE_CHECKING:
    from minillm.spec_decode.speculative_config import SpeculativeConfig

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
KV_ALLOCATORS = ("paged", "contiguous", "contiguous-request")  # engine/contiguous_block_manager.py: the last two
ATTENTION_BACKENDS = ("torch", "triton", "tiled")  # tiled: the online softmax in PyTorch, for reading (exercise 04)
FAST_PATH_MODES = ("auto", "off", "require")  # EngineConfig.fast_path: how a fast path (engine/fast_path.py) is used


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]


@dataclass
class EngineConfig:
    # --- the model: what LLM and every parallel worker load -------------------------------
    model: str | None = None  # None: the default model (SmolLM2-135M-Instruct); a folder or a .gguf file
    dtype: str | torch.dtype = "auto"  # "auto": bfloat16 on CUDA, float32 elsewhere
    device: str | None = None  # default: cuda when available, else cpu
    seed: int = 0
    quantization: str | None = None  # "int8" | "int4" | "int4-awq" | "gptq" | "gguf" (weight-only), "w8a8", "fp8"
    quantization_group_size: int | None = None  # int4 / int4-awq / gptq: 32 (default), 64 or 128
    quantize_lm_head: bool = False  # an int8 LM head (the embedding stays float)
    quantization_calibration: str = "prose"  # int4-awq / gptq / w8a8 calibrate on "prose" or "code" (minillm.eval.text)
    # --- the paged KV cache ---------------------------------------------------------------
    block_size: int = 16  # tokens per KV block
    kv_cache_memory_bytes: int | None = None  # default: 512 MiB on CPU
    gpu_memory_utilization: float = 0.9  # fraction of free device memory for the pool (CUDA)
    num_kv_blocks: int | None = None  # a fixed pool size, overriding the budget (tests, notebooks)
    kv_cache_dtype: str = "auto"  # "auto" (the model's), "int8" or "fp8": quantized, a scale per token per head
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"  # "sha256" (collision-resistant) or "builtin" (Python's hash)
    prefix_cache: str = "hash"  # "hash": chained block hashes; "radix": a token tree, LRU leaves evicted
    # "paged" (blocks on demand), or the pre-paging baseline (engine/contiguous_block_manager.py): one contiguous
    # reservation per sequence of max_model_len slots ("contiguous") or of prompt + max_tokens ("contiguous-request")
    kv_allocator: str = "paged"
    # --- the scheduler --------------------------------------------------------------------
    max_num_seqs: int = 128  # sequences in one step
    max_num_batched_tokens: int = 2048  # tokens in one step (prefill chunks + decodes + drafts)
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    # who waits first and who is preempted first (engine/policy.py): "fcfs", "priority" (a request's
    # priority, lower first, as in vLLM) or "length-aware" (a short-request lane, the three knobs below)
    scheduling_policy: str = "fcfs"
    short_lane_max_tokens: int = 256  # length-aware: prompt + max_tokens at most this is a short request
    short_lane_share: float = 0.25  # length-aware: share of max_num_seqs the long lane may never take
    long_lane_max_wait_steps: int = 64  # length-aware: steps at its lane's head before a long request goes first
    # --- execution ------------------------------------------------------------------------
    # an optional fast path plugged in through engine/fast_path.py (the CPU one: minillm/cpu/):
    # "auto": wherever one applies; "off": the plain PyTorch code alone (nothing compiled or loaded);
    # "require": a clear error where none can run, naming why
    fast_path: str = field(default_factory=envs.fast_path)  # "auto" unless MINILLM_FAST_PATH says otherwise
    # "auto": "triton" on CUDA (the kernels in kernels/), "torch" elsewhere (and with compile=True);
    # "torch" is the reference (on a CPU the fast path subclasses it)
    attention_backend: str = "auto"
    compile: bool = False  # decode steps through torch.compile (inductor freezing)
    cuda_graphs: bool | None = None  # decode steps replayed from CUDA graphs per batch bucket; None: on for CUDA
    # the CPU fast path's float32 Llama-family decode steps of up to 16 rows as one C++ call
    # (minillm/cpu/decode_step.py); None: wherever it applies, True: required (an error says why it
    # cannot run), False: op by op
    cpu_decode_step: bool | None = None
    speculative: SpeculativeConfig | dict[str, Any] | None = None  # e.g. {"method": "ngram", "num_tokens": 4}
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_timeout_s: float = 60.0  # rank 0's longest wait in a collective before calling a worker hung
    distributed_startup_timeout_s: float = 600.0  # every worker loading the model
    worker_threads: int | None = None  # torch threads per worker (default: the cores shared among ranks)

    def __post_init__(self) -> None:
        if self.speculative is not None:  # speculative decoding's settings, loaded only when asked for
            from minillm.spec_decode.speculative_config import parse_speculative

            self.speculative = parse_speculative(self.speculative)
        self.validate()

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineConfig":
        """EngineConfig(**kwargs) with a clear error naming an unknown option."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        return cls(**kwargs)

    def replace(self, **changes: Any) -> "EngineConfig":
        return replace(self, **changes)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return resolve_dtype(self.dtype)

    def backend_for(self, device: torch.device) -> str:
        """The attention backend this engine uses on `device` ("auto" resolved)."""
        if self.attention_backend != "auto":
            return self.attention_backend
        return "triton" if device.type == "cuda" and not self.compile else "torch"

    @property
    def world_size(self) -> int:
        """Processes the model is split over (tensor or pipeline parallel; they do not combine)."""
        return max(self.tensor_parallel_size, self.pipeline_parallel_size)

    def validate(self) -> None:
        """Every check that needs no model. Raises ValueError naming the option."""
        from minillm.attention.kv_quant import resolve_kv_cache_dtype

        if self.dtype != "auto":
            resolve_dtype(self.dtype)
        resolve_kv_cache_dtype(self.kv_cache_dtype)
        if (self.quantization, self.quantization_group_size, self.quantization_calibration) != (None, None, "prose"):
            from minillm.quant.methods import check_llm_options  # the quantization options, loaded only when asked for

            check_llm_options(self.quantization, self.quantization_group_size, self.quantization_calibration)

        def positive_int(name: str, optional: bool = False) -> None:
            v = getattr(self, name)
            if optional and v is None:
                return
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")

        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size",
                     "pipeline_parallel_size", "short_lane_max_tokens"):
            positive_int(name)
        for name in ("num_kv_blocks", "max_model_len", "kv_cache_memory_bytes", "worker_threads"):
            positive_int(name, optional=True)
        if not (0.0 < self.gpu_memory_utilization <= 1.0):
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.attention_backend not in ATTENTION_BACKENDS + ("auto",):
            raise ValueError(f"unknown attention_backend {self.attention_backend!r} "
                             f"(choose one of {ATTENTION_BACKENDS} or 'auto')")
        if self.prefix_caching_hash_algo not in PREFIX_HASH_ALGOS:
            raise ValueError(f"prefix_caching_hash_algo must be one of {PREFIX_HASH_ALGOS}, "
                             f"got {self.prefix_caching_hash_algo!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"unknown scheduling_policy {self.scheduling_policy!r}; choose one of {SCHEDULING_POLICIES}")
        if not (isinstance(self.short_lane_share, (int, float)) and 0.0 <= self.short_lane_share < 1.0):
            raise ValueError(f"short_lane_share must be in [0, 1), got {self.short_lane_share!r}")
        if (not isinstance(self.long_lane_max_wait_steps, int) or isinstance(self.long_lane_max_wait_steps, bool)
                or self.long_lane_max_wait_steps < 0):
            raise ValueError(f"long_lane_max_wait_steps must be an integer >= 0, got {self.long_lane_max_wait_steps!r}")
        if self.prefix_cache not in PREFIX_CACHES:
            raise ValueError(f"prefix_cache must be one of {PREFIX_CACHES}, got {self.prefix_cache!r}")
        if self.kv_allocator not in KV_ALLOCATORS:
            raise ValueError(f"kv_allocator must be one of {KV_ALLOCATORS}, got {self.kv_allocator!r}")
        # combinations (the one place they are checked)
        if self.compile and self.attention_backend not in ("torch", "auto"):
            raise ValueError("compile=True is implemented for the torch attention backend")
        if self.cuda_graphs not in (None, True, False):
            raise ValueError(f"cuda_graphs must be True, False or None (on for CUDA), got {self.cuda_graphs!r}")
        if self.cpu_decode_step not in (None, True, False):
            raise ValueError(f"cpu_decode_step must be True, False or None (where it applies), got {self.cpu_decode_step!r}")
        if self.fast_path not in FAST_PATH_MODES:
            raise ValueError(f"fast_path must be one of {FAST_PATH_MODES}, got {self.fast_path!r}")
        if self.cpu_decode_step and self.fast_path == "off":
            raise ValueError('cpu_decode_step=True is part of the CPU fast path, which fast_path="off" turns off')
        if self.cuda_graphs and self.compile:
            raise ValueError("cuda_graphs=True and compile=True are two ways to speed decode up; choose one")
        if self.tensor_parallel_size > 1 and self.pipeline_parallel_size > 1:
            raise ValueError("tensor_parallel_size > 1 and pipeline_parallel_size > 1 do not combine")
        if self.world_size > 1:
            if self.quantization is not None or self.quantize_lm_head:
                raise ValueError("weight quantization is not supported with tensor or pipeline parallelism")
            if self.speculative is not None:
                raise ValueError("speculative decoding is not supported with tensor or pipeline parallelism")
            if self.compile:
                raise ValueError("compile=True is not supported with tensor or pipeline parallelism")
