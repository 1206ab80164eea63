"""Load a GGUF file (llama.cpp's format): metadata -> ModelConfig, dequantized tensors, tokenizer.

GGUF differs from a Hugging Face folder in three ways that matter here:
- tensor names are llama.cpp's (blk.N.attn_q.weight), mapped back below;
- weights are block-quantized; `gguf.quants.dequantize` turns them into
  float32 with the Hugging Face [out, in] shape (GGUF lists dims reversed);
- for the "llama" architecture, llama.cpp's converter reorders the rows of
  attn_q / attn_k inside each head so that its interleaved RoPE (pairs
  (0,1), (2,3), ...) computes what Hugging Face's rotate-half RoPE (pairs
  (i, i + hd/2)) did. We undo that and keep rotate-half. Qwen2/Qwen3 use
  rotate-half ("NEOX") in llama.cpp too, so their rows are left as they are;
- for "gemma3", llama.cpp's converter stores every norm weight as 1 + w (its
  RMSNorm multiplies by the weight alone); we subtract the 1 again, as
  transformers' GGUF loader does, so the tensors are Hugging Face's. Its
  sliding-window pattern and local RoPE theta are not in the metadata: llama.cpp
  and transformers both fix them (every 6th layer global, theta 10000).
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Iterator

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize
from transformers import PreTrainedTokenizerFast

from minillm.config import ModelConfig
from minillm.engine.fast_path import fast_dequantizer
from minillm.loader.base import LoadedModel, ModelLoadError, check_runnable, empty_model, eos_union, fill_model

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")

# llama.cpp tensor name -> Hugging Face name (the .weight / .bias suffix is carried over).
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 norms both sides of each block: ffn_norm is the pre-MLP norm, and two post norms follow.
GEMMA3_LAYER_NAMES = {
    **LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
GEMMA3_SWA_PATTERN = 6  # llama.cpp's and transformers' default: layers 5, 11, 17, ... are global
GEMMA3_LOCAL_THETA = 10000.0


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight; None if unknown."""
    m = _LAYER_RE.fullmatch(gguf_name)
    if m:
        layer, part, kind = m.groups()
        names = GEMMA3_LAYER_NAMES if arch == "gemma3" else LAYER_NAMES
        return f"model.layers.{layer}.{names[part]}.{kind}" if part in names else None
    base, _, kind = gguf_name.rpartition(".")
    return f"{GLOBAL_NAMES[base]}.{kind}" if base in GLOBAL_NAMES else None


def unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp convert_hf_to_gguf.py's `permute` for attn_q / attn_k.

    llama.cpp: w.reshape(n_heads, 2, hd/2, ...).swapaxes(1, 2) -- row i of the
    first half and row i of the second half of a head become neighbours
    (2i, 2i + 1). Reading them back as (hd/2, 2) and swapping restores the halves.
    Works for weights [rows, in] and biases [rows].
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


class FastGGUFReader(gguf.GGUFReader):
    """gguf.GGUFReader over a plain ndarray view of the file's memory map.

    The reader slices its `data` once per metadata element (~250k for a
    49k-token vocabulary with merges); on an np.memmap every slice runs
    Python-level __getitem__/__array_finalize__, on an ndarray view of the
    same mapping it does not: 3 s -> 0.75 s, same fields and tensors.
    """

    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, mapped: np.ndarray) -> None:
        self._data = mapped.view(np.ndarray)  # the view keeps the memmap (and the file mapping) alive


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Scalar and string metadata. Arrays (the vocabulary, merges) are left to the tokenizer."""
    out: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if not f.types or f.types[0] == GGUFValueType.ARRAY:
            continue
        value = f.parts[f.data[0]]
        out[key] = bytes(value).decode("utf-8") if f.types[0] == GGUFValueType.STRING else value[0].item()
    return out


def config_from_metadata(meta: dict[str, Any], tensors: dict[str, Any], path: str) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ModelLoadError(path, f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
    if "rope_freqs.weight" in tensors:
        raise ModelLoadError(path, "per-frequency RoPE factors (rope_freqs.weight, Llama 3.1 style) are not supported")
    if "token_embd.weight" not in tensors:
        raise ModelLoadError(path, "missing tensor token_embd.weight")

    def get(key: str, default: Any = ...) -> Any:
        if f"{arch}.{key}" in meta:
            return meta[f"{arch}.{key}"]
        if default is ...:
            raise ModelLoadError(path, f"missing metadata {arch}.{key}")
        return default

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise ModelLoadError(path, "partial rotary embeddings (rope.dimension_count != head dim) are not supported")
    rope_scaling = None
    kind = get("rope.scaling.type", "none")
    if kind == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    elif kind != "none":
        raise ModelLoadError(path, f"unsupported rope scaling type {kind!r}")
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]  # all end a turn
    n_layers = int(get("block_count"))
    gemma = gemma3_fields(get, n_layers, hidden, heads, head_dim) if arch == "gemma3" else {}
    return ModelConfig(
        vocab_size=int(tensors["token_embd.weight"].data.shape[0]),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(get("attention.head_count_kv", heads)),
        head_dim=head_dim,
        max_position_embeddings=int(get("context_length", 2048)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=eos_union(*eos),
        model_type=arch,
        **gemma,
    )


def gemma3_fields(get, n_layers: int, hidden: int, heads: int, head_dim: int) -> dict[str, Any]:
    """Gemma 3's ModelConfig fields from its metadata, with llama.cpp's fixed values where it has none."""
    pattern = int(get("attention.sliding_window_pattern", GEMMA3_SWA_PATTERN))
    # llama.cpp scales q by 1/sqrt(head_dim), except Gemma 3 27B (62 layers): 1/sqrt(hidden / heads)
    scalar = hidden / heads if n_layers == 62 else head_dim
    return dict(
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=float(scalar),
        sliding_window=int(get("attention.sliding_window")),
        layer_types=["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)],
        rope_local_base_freq=float(get("rope.freq_base_swa", GEMMA3_LOCAL_THETA)),
        final_logit_softcapping=get("final_logit_softcapping", None),
    )


def supported_tensor_types() -> list[str]:
    """GGML tensor types this loader can turn into floats (what gguf-py dequantizes)."""
    from gguf import quants

    plain = [GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16]
    return list(dict.fromkeys([t.name for t in plain] + sorted(t.name for t in getattr(quants, "_type_traits", {}))))


# Block types the C++ kernels (minillm/cpu/kernels/gguf_matmul.cpp) dequantize, bit for bit as
# gguf-py does (tests/test_gguf_cpu_kernels.py) and ~20x faster than its numpy (a 1.5B Q4_K_M file:
# 35 s -> under 2 s on 2 cores). Other types, and machines where the kernels do not build, use gguf-py.
FAST_DEQUANT_TYPES = {GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0,
                      GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K}




def dequantize_tensor(t, fast=None) -> np.ndarray | torch.Tensor:
    """One GGUF tensor as float32, [rows, cols] in the file's order (numpy from gguf-py, or a tensor)."""
    if fast is not None and t.tensor_type in FAST_DEQUANT_TYPES and len(t.shape) == 2:
        cols, rows = (int(x) for x in t.shape)  # GGUF lists the fastest-varying dimension first
        with warnings.catch_warnings():  # a read-only view of the mmap: the kernel only reads it
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(np.ascontiguousarray(t.data).view(np.uint8).reshape(-1))
        return fast(raw, int(t.tensor_type), rows, cols)
    return dequantize(t.data, t.tensor_type)


def stream_tensors(reader: gguf.GGUFReader, cfg: ModelConfig, path: str,
                   fast_path: str = "auto") -> Iterator[tuple[str, torch.Tensor]]:
    """Dequantize one tensor at a time to float32 and yield it under its Hugging Face name (through a fast
    path's dequantizer where one is offered for a file this size: engine/fast_path.fast_dequantizer)."""
    permuted = cfg.model_type == "llama"
    block_bytes = sum(int(t.n_bytes) for t in reader.tensors if t.tensor_type in FAST_DEQUANT_TYPES)
    fast = fast_dequantizer(fast_path, block_bytes)
    for t in reader.tensors:
        name = hf_name(t.name, cfg.model_type)
        if name is None:
            raise ModelLoadError(path, f"unsupported tensor {t.name!r}")
        try:
            arr = dequantize_tensor(t, fast)
        except NotImplementedError as e:  # a type gguf-py can read but not dequantize (Q8_1, ...)
            raise ModelLoadError(path, f"unsupported tensor type {t.tensor_type.name} (tensor {t.name}); "
                                       f"supported: {', '.join(supported_tensor_types())}") from e
        except Exception as e:  # a block count that does not fit the shape
            raise ModelLoadError(path, f"cannot dequantize {t.name} ({t.tensor_type.name}): {e}") from e
        with warnings.catch_warnings():  # F32 tensors come back as read-only views of the mmap; we only read them
            warnings.simplefilter("ignore", UserWarning)
            w = arr if isinstance(arr, torch.Tensor) else torch.from_numpy(np.asarray(arr))
        if permuted and (".attn_q." in t.name or ".attn_k." in t.name):
            heads = cfg.num_attention_heads if ".attn_q." in t.name else cfg.num_key_value_heads
            w = unpermute_rope_rows(w, heads)
        if cfg.is_gemma3 and t.name.endswith("norm.weight"):
            w = w - 1.0  # stored as 1 + w (see the module docstring)
        yield name, w


def load_tokenizer(path: Path, meta: dict[str, Any]):
    """transformers converts the GGUF vocabulary into a fast tokenizer.

    PreTrainedTokenizerFast rather than AutoTokenizer: AutoTokenizer first parses
    the whole file again to build a config only to choose the class (~2 s), and
    for GGUF it arrives at this same generic fast tokenizer.
    """
    try:
        tok = PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:
        raise ModelLoadError(str(path), f"cannot build a tokenizer from the file's metadata ({e})") from e
    if tok.chat_template is None and "tokenizer.chat_template" in meta:
        tok.chat_template = meta["tokenizer.chat_template"]
    return tok


def open_gguf(path: Path) -> tuple[gguf.GGUFReader, dict[str, Any], ModelConfig]:
    """Map the file and read its header: (reader, metadata, config); no tensor data is read yet.

    Every problem is a ModelLoadError naming the file: not GGUF, truncated, an unknown
    tensor type id, an unsupported architecture.
    """
    try:
        reader = FastGGUFReader(path)
    except ValueError as e:
        if "GGMLQuantizationType" not in str(e):
            raise ModelLoadError(str(path), f"not a readable GGUF file: corrupt or truncated (ValueError: {e})") from e
        # gguf-py: "99 is not a valid GGMLQuantizationType" (or "np.uint32(99) ...")
        type_id = (re.findall(r"\d+", str(e).split(" is not")[0]) or ["?"])[-1]
        raise ModelLoadError(str(path), f"unsupported tensor type id {type_id} (not a GGML type this gguf "
                                        f"package knows; supported: {', '.join(supported_tensor_types())})") from e
    except Exception as e:  # bad magic, truncated header or tensor data, ...
        problem = f"not a readable GGUF file: corrupt or truncated ({type(e).__name__}: {e})"
        raise ModelLoadError(str(path), problem) from e
    meta = read_metadata(reader)
    cfg = config_from_metadata(meta, {t.name: t for t in reader.tensors}, str(path))
    return reader, meta, cfg


def load_gguf(path: Path, dtype: torch.dtype, device: str | torch.device, fast_path: str = "auto") -> LoadedModel:
    reader, meta, cfg = open_gguf(path)
    check_runnable(cfg, str(path))
    model = fill_model(empty_model(cfg, dtype, device), stream_tensors(reader, cfg, str(path), fast_path), str(path))
    tokenizer = load_tokenizer(path, meta)
    eos = eos_union(cfg.eos_token_id, tokenizer.eos_token_id)
    return LoadedModel(cfg, model, tokenizer, eos, {}, str(path))
