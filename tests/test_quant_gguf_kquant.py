"""GGUF Q4_K weights kept quantized: our int4 groups of 32 reproduce the gguf package's dequantize.

gguf-py has no Q4_K quantizer (quants.quantize raises NotImplementedError), so the
synthetic tests build the raw super-blocks here (random bytes, or a small
min/max encoder in llama.cpp's layout); the reference is always gguf's own
dequantize, never our unpacker.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from minillm.quant.gguf import _concat, _rows, gguf_block_int4, keep_gguf_quantized
from minillm.quant.linear import QuantLinear

Q4_K = GGMLQuantizationType.Q4_K
REAL = "qwen2.5-coder-0.5b"


# ----------------------------------------------------------------------------------- raw bytes


def random_q4k(rng: np.random.Generator, rows: int, k: int, gap: tuple[int, int] = (-4, 10)) -> np.ndarray:
    """uint8 [rows, k/256*144]: random codes and 6-bit scales/mins, positive fp16 d and dmin.

    gap: the range of exponent(dmin) - exponent(d), the range where zero is exact in float32.
    """
    nsb = rows * (k // 256)
    blocks = rng.integers(0, 256, (nsb, 144), dtype=np.uint8)
    e_d = rng.integers(-14, -6, nsb)
    d = np.ldexp(rng.uniform(0.5, 1.0, nsb), e_d).astype(np.float16)
    dmin = np.ldexp(rng.uniform(0.5, 1.0, nsb), e_d + rng.integers(gap[0], gap[1] + 1, nsb)).astype(np.float16)
    blocks[:, 0:2] = d.reshape(-1, 1).view(np.uint8)
    blocks[:, 2:4] = dmin.reshape(-1, 1).view(np.uint8)
    return blocks.reshape(rows, -1)


def encode_q4k(w: np.ndarray) -> np.ndarray:
    """float [rows, k] -> Q4_K bytes, min/max per sub-block (a plain version of llama.cpp's quantize_row_q4_K)."""
    rows, k = w.shape
    sb = w.reshape(-1, 8, 32).astype(np.float32)
    lo, hi = np.minimum(sb.min(-1), 0), sb.max(-1)
    scale, mn = (hi - lo) / 15, -lo  # per sub-block, >= 0
    d = (scale.max(-1) / 63).astype(np.float16)
    dmin = (mn.max(-1) / 63).astype(np.float16)
    df, dmf = np.maximum(d.astype(np.float32), 1e-30), np.maximum(dmin.astype(np.float32), 1e-30)
    sc = np.clip(np.rint(scale / df[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(mn / dmf[:, None]), 0, 63).astype(np.uint8)
    step = np.maximum(d.astype(np.float32)[:, None] * sc, 1e-30)
    q = np.clip(np.rint((sb + (dmin.astype(np.float32)[:, None] * m)[..., None]) / step[..., None]), 0, 15)
    q = q.astype(np.uint8).reshape(-1, 4, 2, 32)  # chunk c: sub-blocks 2c (low nibbles), 2c + 1 (high)
    scales = np.concatenate([
        (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6),
        (m[:, :4] & 0x3F) | ((m[:, 4:] >> 4) << 6),
        (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4),
    ], axis=1)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    out = np.concatenate([d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8), scales, qs], axis=1)
    return out.astype(np.uint8).reshape(rows, -1)


# ----------------------------------------------------------------------------------- synthetic


def test_random_q4k_bytes_unpack_to_ggufs_dequantize_bit_for_bit():
    raw = random_q4k(np.random.default_rng(0), 48, 768)
    ref = torch.from_numpy(dequantize(raw, Q4_K))
    w = gguf_block_int4(raw, Q4_K, 768)
    assert w.group_size == 32 and w.scale_zeros.shape == (24, 48, 2)
    assert torch.equal(w.dequantize(), ref)


def test_q4k_zero_outside_the_exact_range_is_one_float32_rounding_off():
    raw = random_q4k(np.random.default_rng(1), 32, 256, gap=(-14, 14))
    ref = torch.from_numpy(dequantize(raw, Q4_K))
    w = gguf_block_int4(raw, Q4_K, 256)
    zero = w.scale_zeros[..., 1].t().repeat_interleave(32, dim=1)
    err = (w.dequantize() - ref).abs()
    # one rounding of zero (2^-24 |zero|) plus at most one of the final sum (2^-24 |w|)
    assert (err <= 2.0 ** -24 * (zero.abs() + ref.abs()) * 1.01).all()


def test_encoded_weights_round_trip_through_gguf_and_us():
    """A real-looking weight (not random bytes): the encoder's codes survive, and equal gguf's dequantize."""
    x = np.random.default_rng(2).normal(0, 0.05, (16, 512)).astype(np.float32)
    raw = encode_q4k(x)
    ref = torch.from_numpy(dequantize(raw, Q4_K))
    assert (ref - torch.from_numpy(x)).abs().max() < 0.02  # the encoder is sane: 4-bit error, not garbage
    assert torch.equal(gguf_block_int4(raw, Q4_K, 512).dequantize(), ref)


def test_q4k_refuses_rows_that_are_not_whole_super_blocks():
    with pytest.raises(ValueError, match="divisible by 256"):
        gguf_block_int4(np.zeros((2, 144), np.uint8), Q4_K, 224)


def test_rope_unpermute_and_concat_mix_q4k_with_q4_0():
    """The fused-qkv path: permuted Q4_K q/k rows un-permuted, stacked with a Q4_0 v, still the file's weights."""
    from gguf.quants import quantize

    from minillm.loader.gguf import unpermute_rope_rows

    rng = np.random.default_rng(3)
    q_raw, k_raw = random_q4k(rng, 64, 256), random_q4k(rng, 32, 256)
    v_raw = quantize(rng.normal(0, 0.05, (32, 256)).astype(np.float32), GGMLQuantizationType.Q4_0)
    parts = [(q_raw, Q4_K, 4), (k_raw, Q4_K, 2), (v_raw, GGMLQuantizationType.Q4_0, None)]
    rows = [_rows(gguf_block_int4(r, t, 256), h) for r, t, h in parts]
    got = _concat(rows, 256).dequantize()
    want = [torch.from_numpy(dequantize(r, t)) for r, t, _ in parts]
    want = torch.cat([unpermute_rope_rows(w, h) if h else w for w, (_, _, h) in zip(want, parts)])
    assert torch.equal(got, want)


@pytest.mark.slow  # transformers import + two tiny files: a few seconds
def test_tiny_llama_q4k_file_keeps_its_codes(tmp_path, monkeypatch):
    """End to end through keep_gguf_quantized on a llama-arch file (RoPE-permuted q/k rows, untied head)."""
    import gguf.quants
    from transformers import AutoTokenizer

    from minillm.loader import load_model
    from tests.helpers.tiny_gguf import write_tiny_gguf
    from tests.helpers.tiny_models import make_tiny_hf_model

    plain = gguf.quants.quantize
    monkeypatch.setattr(gguf.quants, "quantize", lambda a, t: encode_q4k(a) if t == Q4_K else plain(a, t))
    folder, hf_model = make_tiny_hf_model(tmp_path, "llama", rope_scaling=None, hidden_size=256,
                                          intermediate_size=512, head_dim=64)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf_model, AutoTokenizer.from_pretrained(folder), "Q4_K")
    ref, loaded = load_model(path), load_model(path)
    report = keep_gguf_quantized(loaded.model, path, use_cpu_kernels=False)
    assert set(report.values()) == {"Q4_K -> int4 g32"}
    for i, layer in enumerate(loaded.model.layers):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            assert torch.equal(layer.get_submodule(name).dequantize(), ref.model.layers[i].get_submodule(name).weight)


# ----------------------------------------------------------------------------------- the real file


def _real_path():
    from minillm.loader import registry

    st = registry.model_status(REAL)
    if not (st.assembled or not st.missing):  # neither the verified file nor its chunk packages
        pytest.skip(f"{REAL} is not installed ({st.model.install_command()})")
    return registry.resolve_registered(REAL)


# The CPU int4 kernel rounds the scales and zeros (bf16, 2^-8 relative), the activation
# (bf16) and its output (bf16). Measured on Qwen2.5-Coder-0.5B's 12 Q4_K ffn_down, batch 4
# of N(0, 1) rows: 3.6e-3 of the output norm at worst; the bound leaves ~3x room and still
# catches a wrong nibble order or a swapped scale/min (errors of order 100% of the norm).
MATMUL_REL_TOL = 1e-2


@pytest.mark.slow  # reads ~25 MB of Q4_K rows; ~10 s on 2 cores
def test_every_q4k_tensor_of_the_real_file_packs_exactly_and_matmuls_within_tolerance():
    from minillm.loader.gguf import FastGGUFReader

    reader = FastGGUFReader(_real_path())
    tensors = [t for t in reader.tensors if t.tensor_type == Q4_K]
    assert tensors, "the Q4_K_M file has Q4_K tensors"
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for t in tensors:
        ref = torch.from_numpy(dequantize(t.data, Q4_K))  # [N, K]
        w = gguf_block_int4(t.data, Q4_K, ref.shape[1])
        assert torch.equal(w.dequantize(), ref), t.name  # portable layout: bit for bit
        lin = QuantLinear.from_quantized(w)
        assert lin.use_cpu_kernels(), t.name
        x = torch.randn(4, ref.shape[1], generator=gen)
        want = x.double() @ ref.double().t()
        rel = ((lin(x).double() - want).norm() / want.norm()).item()
        worst = max(worst, rel)
        assert rel < MATMUL_REL_TOL, (t.name, rel)
    print(f"{len(tensors)} Q4_K tensors, worst int4-kernel matmul error {worst:.2e} of the output norm")


PROMPTS = ["def fibonacci(n):", "import numpy as np\n\n# load a csv file", "class Stack:\n    def __init__(self):",
           "The capital of France is"]
GREEDY_TOKENS = 16
# The packed model computes with bf16-rounded scales, activations and outputs in 12 of 96
# linears; greedy decoding can flip at a near-tie and then diverge for the rest of the
# sequence. Measured agreement 1.0 on these prompts; 0.75 of the positions must agree
# (a broken mapping makes the model emit noise from the first tokens: agreement ~0).
MIN_AGREEMENT = 0.75


@pytest.mark.slow  # two loads of the 0.5B model (~15 s each) + 2 x 16 decode steps of 4 sequences
def test_real_model_greedy_tokens_agree_with_the_dequantized_float_model(monkeypatch):
    from minillm import LLM, SamplingParams

    monkeypatch.setenv("MINILLM_GGUF_KERNELS", "int4")  # this file tests the int4 mapping (GPU path); see test_gguf_cpu_kernels.py

    _real_path()
    sp = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
    with LLM(REAL, num_kv_blocks=32) as ref:
        want = [o.outputs[0].token_ids for o in ref.generate(PROMPTS, sp, use_tqdm=False)]
    with LLM(REAL, quantization="gguf", num_kv_blocks=32) as q:
        packed = [n for n, r in q.quantization_report.items() if r.endswith("int4 g32")]
        assert packed and all(n.endswith("mlp.down_proj") for n in packed), q.quantization_report
        got = [o.outputs[0].token_ids for o in q.generate(PROMPTS, sp, use_tqdm=False)]
    same = sum(a == b for w, g in zip(want, got) for a, b in zip(w, g))
    total = sum(len(w) for w in want)
    assert all(len(g) == GREEDY_TOKENS for g in got)
    assert same / total >= MIN_AGREEMENT, (same, total)
