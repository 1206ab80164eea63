"""The fused float32 CPU elementwise kernels (minillm/cpu/kernels/fused_elementwise.cpp) against the PyTorch layers.

models/layers.py's plain PyTorch (F.rms_norm, rotate-half RoPE, silu(gate) * up) is the reference:
each kernel agrees with it to float32 rounding in every layout the model hands it (row-major rows,
strided q/k views into the qkv projection, the column-major products of a SkinnyLinear), the model's
layers route float32 CPU inference through them, and a whole engine gives the same greedy tokens
with MINILLM_FUSED_KERNELS on and off.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minillm.cpu.kernels import fused_cpu
from minillm.cpu.layers import CpuRMSNorm, CpuSwiGLU, rotate, swap_layers
from minillm.models.layers import RMSNorm, SwiGLU
from minillm.models.llama import Attention
from tests.helpers.engine_utils import serve_growing_prompts, tiny_model

if not fused_cpu.available():
    pytest.skip("the fused CPU kernels could not be built here", allow_module_level=True)

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():  # the engine's mode; a forward that records a graph keeps the PyTorch layers
        yield


def rows_in_layouts(t: int, h: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"row-major": torch.randn(t, h, generator=g) * 3,
            "column-major": (torch.randn(h, t, generator=g) * 3).t(),  # a SkinnyLinear's column_major_out
            "strided rows": (torch.randn(t, 2 * h, generator=g) * 3)[:, :h]}


@pytest.mark.parametrize("t", [1, 3, 64, 200])
@pytest.mark.parametrize("layout", ["row-major", "column-major", "strided rows"])
def test_add_rms_norm_equals_the_pytorch_layer(t, layout):
    x = rows_in_layouts(t, 576, seed=t)[layout]
    residual = torch.randn(t, 576, generator=torch.Generator().manual_seed(7))
    w = torch.rand(576, generator=torch.Generator().manual_seed(8)) + 0.5
    y, s = fused_cpu.rms_norm(x, w, 1e-5, residual)
    torch.testing.assert_close(s, residual + x, rtol=0, atol=0)  # one float add, the same on either path
    torch.testing.assert_close(y, F.rms_norm(residual + x, (576,), w, 1e-5), **TOL)
    torch.testing.assert_close(fused_cpu.rms_norm(x, w, 1e-5), F.rms_norm(x, (576,), w, 1e-5), **TOL)
    assert y.is_contiguous() and s.is_contiguous()


def test_rms_norm_keeps_leading_dimensions_and_rejects_bad_weights():
    x = torch.randn(2, 5, 64)
    w = torch.rand(64)
    torch.testing.assert_close(fused_cpu.rms_norm(x, w, 1e-6), F.rms_norm(x, (64,), w, 1e-6), **TOL)
    with pytest.raises(RuntimeError, match="weight"):
        fused_cpu.rms_norm(x, torch.rand(63), 1e-6)
    with pytest.raises(RuntimeError, match="float32"):
        fused_cpu.rms_norm(x.double(), w, 1e-6)


@pytest.mark.parametrize("t", [1, 7, 130])
def test_rope_equals_rotate_half_on_the_qkv_views(t):
    heads, kv_heads, d = 9, 3, 64
    g = torch.Generator().manual_seed(t)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g)
    qk = qkv[:, : (heads + kv_heads) * d].view(t, heads + kv_heads, d)  # as Attention.forward slices it
    angles = torch.rand(t, 1, d // 2, generator=g) * 50
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = qk.chunk(2, dim=-1)
    want = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    got = fused_cpu.rope(qk, cos, sin)
    torch.testing.assert_close(got, want, **TOL)
    assert got.is_contiguous() and torch.equal(qkv[:, : (heads + kv_heads) * d].view_as(qk), qk)  # input untouched


@pytest.mark.parametrize("t", [1, 5, 300])
@pytest.mark.parametrize("layout", ["row-major", "column-major"])
def test_silu_mul_equals_silu_times_up_in_the_same_layout(t, layout):
    gate_up = rows_in_layouts(t, 2 * 1536, seed=t)[layout] * 10  # gates past +-30: both tails of the exponential
    gate, up = gate_up.chunk(2, dim=-1)
    got = fused_cpu.silu_mul(gate_up)
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=1e-5, atol=1e-4)
    assert got.stride() == ((1, t) if layout == "column-major" and t > 1 else (1536, 1))


def test_the_layers_route_float32_cpu_inference_through_the_kernels(monkeypatch):
    calls = []
    for name in ("rms_norm", "rope", "silu_mul"):
        monkeypatch.setattr(fused_cpu, name, (lambda f, n: lambda *a: calls.append(n) or f(*a))(getattr(fused_cpu, name), name))
    plain_norm, plain_mlp = RMSNorm(32, 1e-6), SwiGLU(32, 48)
    x = torch.randn(4, 32)
    plain_norm(x), plain_mlp(x)
    assert calls == []  # the plain layers never call C++
    norm, mlp = CpuRMSNorm(32, 1e-6), CpuSwiGLU(32, 48)
    norm(x), norm(x, x)
    mlp(x)
    rotate(torch.randn(4, 2, 8), torch.randn(4, 1, 4), torch.randn(4, 1, 4))
    assert calls == ["rms_norm", "rms_norm", "silu_mul", "rope"]
    calls.clear()
    gemma = RMSNorm(32, 1e-6, unit_offset=True)
    swap_layers(gemma)
    norm(x.double()), gemma(x)  # another dtype; Gemma's 1 + w scale
    with torch.enable_grad():
        norm(x.requires_grad_())  # a forward that records a graph
    assert calls == []


def test_swap_layers_gives_every_norm_mlp_and_attention_its_cpu_class():
    model = tiny_model(heads=6, kv_heads=2, head_dim=16)
    swapped = swap_layers(model)
    layers = len(model.layers)
    assert swapped == 4 * layers + 1  # two norms, the MLP and the attention per layer; the final norm
    assert all(type(layer.mlp) is CpuSwiGLU and type(layer.input_layernorm) is CpuRMSNorm for layer in model.layers)
    assert all(isinstance(layer.self_attn, Attention) and layer.self_attn.rotate is rotate for layer in model.layers)
    assert swap_layers(model) == 0  # once only


def test_the_engine_gives_the_same_tokens_with_the_kernels_off(monkeypatch):
    model = tiny_model(heads=6, kv_heads=2, head_dim=16)
    plain = serve_growing_prompts(model, fast_path="off")  # first: the fast path changes the model in place
    assert type(model.layers[0].mlp) is SwiGLU
    assert serve_growing_prompts(model, fast_path="auto") == plain
    assert type(model.layers[0].mlp) is CpuSwiGLU
