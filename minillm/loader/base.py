"""What every loader returns, its error type, and the steps all formats share.

A format-specific loader (hf.py, gguf.py) only has to produce a ModelConfig, a
stream of Hugging Face-named tensors and a tokenizer; building the model,
checking that nothing is missing and collecting the EOS ids happen here.
"""
from __future__ import annotations

from contextlib import contextmanager
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import torch
from torch import nn

from minillm.config import ModelConfig
from minillm.models.layers import MLP_KINDS, rope_inv_freq
from minillm.models.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# model_type values we implement: the one Llama-family decoder (SmolLM2 is "llama"), Gemma 3's text model
# and the two mixture-of-experts families (models/moe_models.py).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "mixtral", "qwen2_moe")


class ModelLoadError(ValueError):
    """A model file is corrupt, truncated or describes something we cannot run.

    The message always names the file and the problem.
    """

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclass
class LoadedModel:
    config: ModelConfig
    model: LlamaForCausalLM  # eval mode, on device, in dtype, no grads
    tokenizer: "PreTrainedTokenizerBase"  # fast; chat_template set when the source has one
    eos_token_ids: list[int]  # union of config / generation_config / tokenizer EOS
    generation_config: dict[str, Any] = field(default_factory=dict)  # generation_config.json, or {}
    source: str = ""  # the resolved path that was loaded


def check_runnable(cfg: ModelConfig, path: str) -> None:
    """Refuse now, naming the file, what the model code would refuse while being built."""
    try:
        rope_inv_freq(cfg)
    except (KeyError, ValueError) as e:
        raise ModelLoadError(path, f"{e} in rope_scaling {cfg.rope_scaling}") from e
    if cfg.hidden_activation not in MLP_KINDS:
        raise ModelLoadError(path, f"unsupported hidden_activation {cfg.hidden_activation!r}")


@contextmanager
def _skip_random_init() -> Iterator[None]:
    """Make nn.Linear / nn.Embedding leave their weights uninitialised (torch.empty).

    Every weight is about to be overwritten from the file, so random init would
    be wasted: about 2 s for 135M parameters on 2 cores. (Building on the meta
    device instead would also skip it, but computing the RoPE tables there
    imports torch._dynamo, which costs as much.)
    """
    classes = [nn.Linear, nn.Embedding]
    if "minillm.models.moe" in sys.modules:  # a MoE model class was chosen: its experts' init too
        classes.append(sys.modules["minillm.models.moe"].Experts)
    saved = {cls: cls.reset_parameters for cls in classes}
    for cls in saved:
        cls.reset_parameters = lambda self: None
    try:
        yield
    finally:
        for cls, fn in saved.items():
            cls.reset_parameters = fn


def model_class(cfg: ModelConfig) -> type[LlamaForCausalLM]:
    """Gemma 3's decoder, a MoE family's (each a LlamaForCausalLM with its own layers), or the Llama-family one
    (the other families' modules are imported only for their models)."""
    if cfg.is_moe:
        from minillm.models.moe_models import MOE_MODELS, SparseMoeForCausalLM

        return MOE_MODELS.get(cfg.model_type, SparseMoeForCausalLM)
    if cfg.is_gemma3:
        from minillm.models.gemma3 import Gemma3ForCausalLM

        return Gemma3ForCausalLM
    return LlamaForCausalLM


def empty_model(cfg: ModelConfig, dtype: torch.dtype, device: str | torch.device) -> LlamaForCausalLM:
    """The model on device with parameters in dtype, not yet initialised; buffers (RoPE tables) stay float32."""
    with _skip_random_init(), torch.device(device):
        model = model_class(cfg)(cfg)
    for p in model.parameters():  # swapping .data keeps each Parameter object: tied weights stay tied
        p.data = torch.empty_like(p.data, dtype=dtype)
    return model


def fill_model(
    model: LlamaForCausalLM, weights: Iterable[tuple[str, torch.Tensor]], path: str
) -> LlamaForCausalLM:
    """Stream Hugging Face-named tensors into the model and check that every weight was written."""
    try:
        written = model.load_weights(weights)
    except ModelLoadError:  # raised by the format's own tensor stream, already names its file
        raise
    except (KeyError, ValueError) as e:  # unexpected tensor name, wrong shape
        raise ModelLoadError(path, str(e).strip("'\"")) from e
    missing = sorted(model.expected_weights() - written)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelLoadError(path, f"missing tensors for {shown}")
    model.requires_grad_(False)
    return model.eval()


def eos_union(*sources: int | Iterable[int] | None) -> list[int]:
    """All end-of-sequence ids from several sources, first-seen order, no duplicates."""
    ids: list[int] = []
    for src in sources:
        if src is None:
            continue
        for i in [src] if isinstance(src, int) else src:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids
