"""GGUF Q4_0 / Q4_1 weights kept quantized: our int4 groups reproduce the gguf package's dequantize."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from minillm.quant.gguf import gguf_block_int4, keep_gguf_quantized
from minillm.quant.linear import QuantLinear


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1])
def test_block_codes_map_onto_int4_groups_of_32(qtype):
    arr = np.random.default_rng(0).normal(0, 0.05, (24, 96)).astype(np.float32)
    raw = quantize(arr, qtype)
    ref = torch.from_numpy(dequantize(raw, qtype))
    w = gguf_block_int4(raw, qtype, 96)
    assert w.group_size == 32 and w.scale_zeros.shape == (3, 24, 2)
    got = w.dequantize()
    if qtype == GGMLQuantizationType.Q4_0:
        assert torch.equal(got, ref)  # zero = 0: the same products, bit for bit
    else:  # zero = m + 8d is rounded once in float32
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)


def test_other_types_and_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="only"):
        gguf_block_int4(np.zeros((2, 34), np.uint8), GGMLQuantizationType.Q8_0, 32)
    with pytest.raises(ValueError, match="divisible by 32"):
        gguf_block_int4(np.zeros((2, 20), np.uint8), GGMLQuantizationType.Q4_1, 40)


@pytest.mark.slow
def test_default_model_keeps_every_decoder_linear_as_the_files_int4(default_model):
    from minillm.loader import load_model

    loaded = load_model(dtype=torch.float32)
    report = keep_gguf_quantized(loaded.model, loaded.source, use_cpu_kernels=False)
    assert len(report) == 4 * 30 and set(report.values()) == {"Q4_1 -> int4 g32"}
    ref = default_model.model
    for i in (0, 17, 29):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            q = loaded.model.layers[i].get_submodule(name)
            assert isinstance(q, QuantLinear) and q.bits == 4 and q.group_size == 32
            want = ref.layers[i].get_submodule(name).weight  # dequantized by the gguf package at load
            torch.testing.assert_close(q.dequantize(), want, atol=1e-6, rtol=0)  # incl. the un-permuted RoPE rows


@pytest.mark.slow  # importing transformers and writing two files: ~7 s on the first call
@pytest.mark.parametrize("family,quant", [("llama", "Q4_0"), ("qwen2", "Q4_1")])
def test_tiny_gguf_files_keep_their_codes(tmp_path, family, quant):
    """Both block types, with (llama) and without (qwen2) llama.cpp's RoPE row permutation; qwen2 has qkv biases."""
    from transformers import AutoTokenizer

    from minillm.loader import load_model
    from tests.helpers.tiny_gguf import write_tiny_gguf
    from tests.helpers.tiny_models import make_tiny_hf_model

    overrides = {"rope_scaling": None} if family == "llama" else {}
    folder, hf_model = make_tiny_hf_model(tmp_path, family, **overrides)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf_model, AutoTokenizer.from_pretrained(folder), quant)
    ref, loaded = load_model(path), load_model(path)
    report = keep_gguf_quantized(loaded.model, path, use_cpu_kernels=False)
    assert set(report.values()) == {f"{quant} -> int4 g32"}
    for i, layer in enumerate(loaded.model.layers):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            q, want = layer.get_submodule(name), ref.model.layers[i].get_submodule(name)
            torch.testing.assert_close(q.dequantize(), want.weight, atol=1e-6, rtol=0)
            if want.bias is not None:
                assert torch.equal(q.bias, want.bias)
