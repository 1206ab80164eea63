"""GGUF specifics: the Q/K row permutation, tensor names, tiny GGUF files of each architecture.

The default model's GGUF is compared with transformers in test_model_vs_transformers.py;
here tiny models are written as GGUF (tests/helpers/tiny_gguf.py) in F32, F16 and Q8_0.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from minillm.loader import ModelLoadError, load_model
from minillm.loader.gguf import hf_name, unpermute_rope_rows
from minillm.models.standalone import forward_logits
from tests.helpers.tiny_gguf import llama_cpp_permute, write_tiny_gguf
from tests.helpers.tiny_models import make_tiny_hf_model

# Same weights on both sides (F32 exactly, Q8_0 through two dequantizers): 2 layers,
# logits ~7. Measured <= 1e-5 for every family and type.
ATOL = 5e-5
# F16-rounded weights against the original fp32 model: measured 1e-2 .. 2e-2.
F16_ATOL = 5e-2


@settings(max_examples=30, deadline=None)
@given(heads=st.integers(1, 6), half_dim=st.integers(1, 8), cols=st.integers(0, 5))
def test_unpermute_inverts_llama_cpp_permute(heads, half_dim, cols):
    shape = (heads * 2 * half_dim, cols) if cols else (heads * 2 * half_dim,)  # weights and biases
    w = torch.randn(shape)
    permuted = torch.from_numpy(llama_cpp_permute(w.numpy(), heads))
    assert torch.equal(unpermute_rope_rows(permuted, heads), w)


def test_unpermute_pairs_rows_across_half_heads():
    """Row 2i and 2i+1 of a llama.cpp head are rows i and i + hd/2 of the Hugging Face head."""
    hd = 8
    hf_rows = torch.arange(2 * hd, dtype=torch.float32)[:, None]  # 2 heads
    gguf_rows = torch.from_numpy(llama_cpp_permute(hf_rows.numpy(), 2))
    assert gguf_rows[:hd, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert torch.equal(unpermute_rope_rows(gguf_rows, 2), hf_rows)


@pytest.mark.parametrize("arch", ["LLAMA", "QWEN2", "QWEN3"])
def test_names_agree_with_the_gguf_package(arch):
    """Our llama.cpp -> HF name table inverts the gguf package's HF -> llama.cpp map."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch], 2)
    ours = [
        "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
        *(f"model.layers.1.{p}.weight" for p in (
            "input_layernorm", "post_attention_layernorm", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
        )),
        *(f"model.layers.1.self_attn.{p}.{k}" for p in ("q_proj", "k_proj", "v_proj") for k in ("weight", "bias")),
    ]
    if arch == "QWEN3":
        ours += ["model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"]
    for name in ours:
        assert hf_name(names.get_name(name, try_suffixes=(".weight", ".bias"))) == name
    assert hf_name("rope_freqs.weight") is None and hf_name("blk.0.attn_qkv.weight") is None


def _tiny_gguf(tmp_path, family: str, quant: str):  # -> (path, the transformers model it came from)
    overrides = {"rope_scaling": None} if family == "llama" else {}  # llama3 RoPE needs rope_freqs in GGUF
    folder, hf_model = make_tiny_hf_model(tmp_path, family, **overrides)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf_model, AutoTokenizer.from_pretrained(folder), quant)
    return path, hf_model


def _ids() -> list[int]:
    return torch.randint(0, 320, (40,), generator=torch.Generator().manual_seed(0)).tolist()


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_tiny_gguf_f32_matches_the_original_model(tmp_path, family):
    path, hf_model = _tiny_gguf(tmp_path, family, "F32")
    loaded = load_model(str(path))
    cfg = loaded.config
    assert cfg.model_type == {"mistral": "llama"}.get(family, family)
    assert cfg.head_dim == hf_model.model.layers[0].self_attn.head_dim
    assert cfg.tie_word_embeddings == hf_model.config.tie_word_embeddings
    assert (cfg.attention_bias, cfg.qk_norm) == (family == "qwen2", family == "qwen3")
    assert loaded.eos_token_ids == [2] and loaded.tokenizer.chat_template and loaded.generation_config == {}
    ids = _ids()
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
    assert (forward_logits(loaded.model, ids) - ref).abs().max().item() < ATOL


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # permuted and not permuted
def test_tiny_gguf_q8_0_matches_transformers_reading_it(tmp_path, family):
    """transformers dequantizes and un-permutes the same file with its own code."""
    path, _ = _tiny_gguf(tmp_path, family, "Q8_0")
    loaded = load_model(str(path))
    ref_model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    ids = _ids()
    with torch.no_grad():
        ref = ref_model.eval()(torch.tensor([ids])).logits[0]
    assert (forward_logits(loaded.model, ids) - ref).abs().max().item() < ATOL


def test_tiny_gguf_f16_into_bf16(tmp_path):
    path, hf_model = _tiny_gguf(tmp_path, "qwen3", "F16")
    f32 = load_model(str(path))
    ids = _ids()
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
    assert (forward_logits(f32.model, ids) - ref).abs().max().item() < F16_ATOL
    bf16 = load_model(str(path), dtype=torch.bfloat16)
    assert bf16.model.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.isfinite(forward_logits(bf16.model, ids)).all()


def test_rope_freqs_is_refused(tmp_path):
    """Llama 3.1-style GGUFs carry per-frequency RoPE factors we do not implement yet: say so."""
    folder, hf_model = make_tiny_hf_model(tmp_path, "llama", rope_scaling=None)
    path = write_tiny_gguf(
        tmp_path / "freqs.gguf", hf_model, AutoTokenizer.from_pretrained(folder),
        extra_tensors={"rope_freqs.weight": np.ones(8, dtype=np.float32)},
    )
    with pytest.raises(ModelLoadError, match="rope_freqs.weight") as err:
        load_model(str(path))
    assert str(path) in str(err.value)


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gpt2'") as err:
        load_model(str(path))
    assert str(path) in str(err.value)
