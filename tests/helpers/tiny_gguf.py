"""Write a tiny Hugging Face model as a GGUF file, the way llama.cpp's converter would.

    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf_model, tokenizer, quant="Q8_0")

Follows convert_hf_to_gguf.py where it matters for loading: llama.cpp tensor
names (from the gguf package's own table), metadata keys per architecture,
Q/K rows permuted for interleaved RoPE on the "llama" architecture only
(Qwen2/Qwen3 keep rotate-half), no output.weight when embeddings are tied, a
byte-level BPE vocabulary padded to the model's vocab size. transformers
reads these files independently of minillm, so it serves as the reference.
"""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}  # llama.cpp writes Mistral as llama


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rotate-half rows -> interleaved-pair rows, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _add_tokenizer(w: GGUFWriter, tokenizer, vocab_size: int) -> None:
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [""] * vocab_size
    for tok, i in vocab.items():
        tokens[i] = tok
    special = {t["id"] for t in spec["added_tokens"]}
    for i in range(len(vocab), vocab_size):  # rows the tokenizer never produces
        tokens[i] = f"[PAD{i}]"
    types = [
        gguf.TokenType.CONTROL if i in special else gguf.TokenType.UNUSED if i >= len(vocab) else gguf.TokenType.NORMAL
        for i in range(vocab_size)
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokenizer.bos_token_id)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_pad_token_id(tokenizer.pad_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(tokenizer.chat_template)


def write_tiny_gguf(
    path: Path, hf_model, tokenizer, quant: str = "F32", extra_tensors: dict[str, np.ndarray] | None = None
) -> Path:
    """quant: "F32", "F16" or "Q8_0" for the 2-D weights (norms and biases stay F32, as in llama.cpp).

    extra_tensors are written as they are (to test what the loader refuses).
    """
    cfg = hf_model.config
    arch = ARCH[cfg.model_type]
    head_dim = hf_model.model.layers[0].self_attn.head_dim
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(head_dim)
    if head_dim != cfg.hidden_size // cfg.num_attention_heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    _add_tokenizer(w, tokenizer, cfg.vocab_size)

    # The gguf package's own HF -> llama.cpp name table, independent of minillm's.
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    qtype = GGMLQuantizationType[quant]
    tied = cfg.tie_word_embeddings
    for name, t in hf_model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        arr = t.detach().float().numpy()
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
            arr = llama_cpp_permute(arr, heads)
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if arr.ndim == 2 and qtype != GGMLQuantizationType.F32:
            w.add_tensor(gname, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, np.ascontiguousarray(arr))
    for name, arr in (extra_tensors or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
