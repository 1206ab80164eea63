"""The C++ GGUF block kernels (minillm/cpu/kernels/gguf_matmul.cpp) against gguf-py, the outside reference.

- dequantize: equals gguf.quants.dequantize bit for bit, every supported type.
- qmatmul: within ACT_TOL of x @ dequant(W).T (the activation's 8-bit blocks are the
  only rounding), the SIMD path equals the portable C++ path to float rounding, and
  a batch of rows (tiled four at a time) equals each row alone.
- The AVX2-only and portable builds (ATEN_CPU_CAPABILITY=avx2 / default), each in its
  own process, give the same products as this machine's native build.
Random blocks: gguf-py's own quantizer where it has one (Q4_0, Q4_1, Q5_0, Q8_0); for
the K-quants (gguf-py cannot encode them) random bytes with sane fp16 scales.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from minillm.cpu.kernels import gguf_cpu

OK, WHY = gguf_cpu.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"GGUF CPU kernels unavailable: {WHY}")

# measured 0.53-0.72% of the output norm for Gaussian x (per-32 blocks ~0.55%, per-256 ~0.7%)
ACT_TOL = 1.5e-2
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"]


def random_blocks(type_name: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """uint8 [rows, row bytes] of valid blocks of this type."""
    rng = np.random.default_rng(seed)
    qtype = T[type_name]
    if type_name in ("Q4_0", "Q4_1", "Q5_0", "Q8_0"):
        w = rng.standard_normal((rows, k)).astype(np.float32) * 0.05
        return quantize(w, qtype).reshape(rows, -1)
    per, nbytes = gguf_cpu.BLOCK[gguf_cpu.TYPE_IDS[type_name]]
    blocks = rng.integers(0, 256, (rows * k // per, nbytes), dtype=np.uint8)
    d = rng.uniform(1e-4, 1e-3, (blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
    if type_name == "Q4_K":  # d, dmin first
        blocks[:, 0:2] = d
        blocks[:, 2:4] = rng.uniform(1e-4, 1e-3, (blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
    else:  # Q6_K: d last
        blocks[:, 208:210] = d
    return blocks.reshape(rows, -1)


def _ref(type_name: str, blocks: np.ndarray, k: int) -> torch.Tensor:
    return torch.from_numpy(dequantize(blocks, T[type_name]).reshape(blocks.shape[0], k).astype(np.float32))


def _matmul(x: torch.Tensor, blocks: np.ndarray, type_name: str, portable: bool = False) -> torch.Tensor:
    ops, tid = gguf_cpu.load(), gguf_cpu.TYPE_IDS[type_name]
    act = ops.quantize_act(x, gguf_cpu.activation_block(tid))
    return ops.qmatmul(*act, torch.from_numpy(blocks).reshape(-1), tid, blocks.shape[0], portable)


@pytest.mark.parametrize("block", [32, 256])
def test_the_activation_codes_equal_a_plain_torch_quantizer(block):
    """int8 codes per block: scale amax / 127, codes x * (1 / scale) rounded half to even (the SIMD
    conversion's rounding and std::nearbyint's); exact, zero blocks and all."""
    x = torch.randn(3, 512) * torch.tensor([1.0, 1e-3, 40.0])[:, None]
    x[1, :block] = 0.0  # an all-zero block: scale 0, codes 0
    q, d, bs, xs = gguf_cpu.load().quantize_act(x, block)
    blocks = x.reshape(3, -1, block)
    scale = blocks.abs().amax(-1) / 127
    inv = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    codes = torch.round(blocks * inv[..., None]).to(torch.int8).reshape(3, 512)
    assert torch.equal(d, scale)
    assert torch.equal(q, codes)
    assert torch.equal(bs, codes.reshape(3, -1, 16).sum(-1).to(torch.int16))
    assert torch.equal(xs, scale.repeat_interleave(block // 32, 1) * codes.reshape(3, -1, 32).sum(-1).float())


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantize_equals_gguf_py(type_name):
    rows, k = 40, 512
    blocks = random_blocks(type_name, rows, k)
    ours = gguf_cpu.load().dequantize(torch.from_numpy(blocks).reshape(-1), gguf_cpu.TYPE_IDS[type_name], rows, k)
    assert torch.equal(ours, _ref(type_name, blocks, k))


@pytest.mark.parametrize("type_name", TYPES)
def test_matmul_matches_the_dequantized_weight(type_name):
    rows, k = 72, 1024
    blocks = random_blocks(type_name, rows, k, seed=1)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(2))
    want = x.double() @ _ref(type_name, blocks, k).double().T
    got = _matmul(x, blocks, type_name)
    err = ((got.double() - want).norm() / want.norm()).item()
    assert err < ACT_TOL, err
    # a wrong nibble order or scale is far outside the activation's rounding
    assert err > 1e-5, "suspiciously exact: is the activation still quantized?"
    portable = _matmul(x, blocks, type_name, portable=True)
    torch.testing.assert_close(got, portable, rtol=1e-5, atol=1e-5 * portable.abs().max().item())


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K", "Q6_K"])
def test_a_batch_equals_each_row_alone(type_name):
    rows, k = 48, 512
    blocks = random_blocks(type_name, rows, k, seed=3)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(4))  # 4 + 4 + 1: full tiles and a remainder
    batch = _matmul(x, blocks, type_name)
    alone = torch.cat([_matmul(x[i : i + 1], blocks, type_name) for i in range(9)])
    torch.testing.assert_close(batch, alone, rtol=0, atol=0)


def test_bad_shapes_are_clear_errors():
    ops = gguf_cpu.load()
    blocks = torch.from_numpy(random_blocks("Q4_K", 4, 256)).reshape(-1)
    act = ops.quantize_act(torch.randn(1, 256), 256)
    with pytest.raises(RuntimeError, match="expected"):
        ops.qmatmul(*act, blocks[:-1].contiguous(), gguf_cpu.TYPE_IDS["Q4_K"], 4)
    act32 = ops.quantize_act(torch.randn(1, 256), 32)
    with pytest.raises(RuntimeError, match="blocks of 256"):
        ops.qmatmul(*act32, blocks, gguf_cpu.TYPE_IDS["Q4_K"], 4)
    with pytest.raises(RuntimeError, match="unsupported GGUF type"):
        ops.dequantize(blocks, 13, 4, 256)  # Q5_K: no kernel


_CHILD = """
import json, sys, numpy as np, torch
sys.path.insert(0, {root!r})
from tests.test_gguf_cpu_kernels import TYPES, _interleaved_products, _matmul, random_blocks
from minillm.cpu.kernels import gguf_cpu
out = {{"isa": gguf_cpu.load().isa()}}
x = torch.randn(2, 512, generator=torch.Generator().manual_seed(5))
for t in TYPES:
    out[t] = _matmul(x, random_blocks(t, 24, 512, seed=6), t).tolist()
if out["isa"] != "portable":  # the interleaved layouts are AVX2 code
    out["x8"] = _interleaved_products(x)
print(json.dumps(out))
"""


def _interleaved_products(x: torch.Tensor) -> dict[str, list]:
    """linear() on the Q4_Kx8 and Q4_1x8 layouts of fixed random blocks (the builds are compared on them)."""
    ops = gguf_cpu.load()
    q4k = gguf_cpu.repack_q4k_x8(torch.from_numpy(random_blocks("Q4_K", 24, 512, seed=6)))
    q41 = gguf_cpu.repack_q4_1_x8(torch.from_numpy(random_blocks("Q4_1", 24, 512, seed=6)))
    q80 = gguf_cpu.repack_q8_0_x8(torch.from_numpy(random_blocks("Q8_0", 24, 512, seed=6)))
    q50 = gguf_cpu.repack_q5_0_x8(torch.from_numpy(random_blocks("Q5_0", 24, 512, seed=6)))
    return {"Q4_KX8": ops.linear(x, [q4k], [gguf_cpu.Q4_KX8], None).tolist(),
            "Q4_1X8": ops.linear(x, [q41], [gguf_cpu.Q4_1X8], None).tolist(),
            "Q8_0X8": ops.linear(x, [q80], [gguf_cpu.Q8_0X8], None).tolist(),
            "Q5_0X8": ops.linear(x, [q50], [gguf_cpu.Q5_0X8], None).tolist()}


@pytest.mark.slow  # two extra builds of the kernels (~20 s each, cached afterwards)
@pytest.mark.parametrize("capability,isa", [("avx2", "avx2"), ("default", "portable")])
def test_avx2_and_portable_builds_agree_with_this_build(capability, isa):
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the AVX2 build is x86 only")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    run = subprocess.run([sys.executable, "-c", _CHILD.format(root=root)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    child = json.loads(run.stdout.strip().splitlines()[-1])
    assert child["isa"] == isa
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(5))
    for t in TYPES:
        mine = _matmul(x, random_blocks(t, 24, 512, seed=6), t)
        torch.testing.assert_close(torch.tensor(child[t]), mine, rtol=1e-5, atol=1e-5 * mine.abs().max().item())
    if isa != "portable" and gguf_cpu.load().isa() != "portable":
        for name, mine in _interleaved_products(x).items():
            mine = torch.tensor(mine)
            torch.testing.assert_close(torch.tensor(child["x8"][name]), mine, rtol=1e-5,
                                       atol=1e-5 * mine.abs().max().item())


@pytest.mark.parametrize("types", [["Q4_K", "Q4_K", "Q6_K"], ["Q5_0", "Q8_0"], ["Q6_K", "Q4_1"]])
def test_the_layer_op_stacks_mixed_parts_and_adds_the_bias(types):
    """linear(): Qwen2.5's fused qkv mixes Q4_K and Q6_K (one activation per block size, one parallel region)."""
    ops, k = gguf_cpu.load(), 512
    parts = [random_blocks(t, rows, k, seed=10 + i) for i, (t, rows) in enumerate(zip(types, (40, 8, 24)))]
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(7))
    bias = torch.randn(sum(p.shape[0] for p in parts))
    got = ops.linear(x, [torch.from_numpy(p).reshape(-1) for p in parts], [gguf_cpu.TYPE_IDS[t] for t in types], bias)
    want = torch.cat([_matmul(x, p, t) for p, t in zip(parts, types)], dim=1) + bias
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * want.abs().max().item())
    with pytest.raises(RuntimeError, match="whole rows"):
        ops.linear(x, [torch.from_numpy(parts[0]).reshape(-1)[:-2].contiguous()], [gguf_cpu.TYPE_IDS[types[0]]], None)


def test_the_interleaved_q4k_layout_round_trips_and_multiplies_like_the_files():
    """Q4_Kx8 (8 rows interleaved, as llama.cpp repacks Q4_K): same codes, same products."""
    raw = torch.from_numpy(random_blocks("Q4_K", 48, 768, seed=8))
    packed = gguf_cpu.repack_q4k_x8(raw)
    assert packed.numel() == raw.numel() * 1184 // 1152
    assert torch.equal(gguf_cpu.unpack_q4k_x8(packed, 48, 768), raw)
    ops = gguf_cpu.load()
    if ops.isa() == "portable":
        pytest.skip("the interleaved kernel is AVX2 code")
    x = torch.randn(6, 768, generator=torch.Generator().manual_seed(9))
    want = ops.linear(x, [raw.reshape(-1).contiguous()], [gguf_cpu.TYPE_IDS["Q4_K"]], None)
    got = ops.linear(x, [packed], [gguf_cpu.Q4_KX8], None)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    # up to four activation rows share each unpacked weight load: a batch equals each row alone
    x9 = torch.randn(9, 768, generator=torch.Generator().manual_seed(10))
    batch = ops.linear(x9, [packed], [gguf_cpu.Q4_KX8], None)
    alone = torch.cat([ops.linear(x9[i : i + 1], [packed], [gguf_cpu.Q4_KX8], None) for i in range(9)])
    torch.testing.assert_close(batch, alone, rtol=0, atol=0)
    with pytest.raises(ValueError, match="multiple of 8"):
        gguf_cpu.repack_q4k_x8(raw[:12])


@pytest.mark.parametrize("type_name", ["Q4_1", "Q4_0"])
def test_the_interleaved_q4_1_layout_round_trips_and_multiplies_like_the_files(type_name):
    """Q4_1x8 (8 rows interleaved; Q4_0 enters as Q4_1 with m = -8 d): the same weights, and the same
    products as the file type's row-by-row kernel to float rounding, within ACT_TOL of x @ dequant(W).T."""
    raw_np = random_blocks(type_name, 48, 768, seed=11)
    raw = torch.from_numpy(raw_np)
    packed = gguf_cpu.repack_q4_1_x8(raw, type_name)
    assert packed.numel() == 48 * 768 // 32 * 20  # Q4_1's bytes: the layout adds nothing
    back = gguf_cpu.unpack_q4_1_x8(packed, 48, 768)
    if type_name == "Q4_1":
        assert torch.equal(back, raw)
    ops = gguf_cpu.load()
    # the unpacked blocks stand for exactly the file's weights (Q4_0's offset moved into an exact min)
    torch.testing.assert_close(ops.dequantize(back.reshape(-1).contiguous(), gguf_cpu.TYPE_IDS["Q4_1"], 48, 768),
                               _ref(type_name, raw_np, 768), rtol=0, atol=0)
    if ops.isa() == "portable":
        pytest.skip("the interleaved kernel is AVX2 code")
    x = torch.randn(6, 768, generator=torch.Generator().manual_seed(12))
    want = ops.linear(x, [raw.reshape(-1).contiguous()], [gguf_cpu.TYPE_IDS[type_name]], None)
    got = ops.linear(x, [packed], [gguf_cpu.Q4_1X8], None)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    ref = x @ _ref(type_name, raw_np, 768).T
    assert (got - ref).norm() / ref.norm() < ACT_TOL
    x9 = torch.randn(9, 768, generator=torch.Generator().manual_seed(13))
    batch = ops.linear(x9, [packed], [gguf_cpu.Q4_1X8], None)
    alone = torch.cat([ops.linear(x9[i : i + 1], [packed], [gguf_cpu.Q4_1X8], None) for i in range(9)])
    torch.testing.assert_close(batch, alone, rtol=0, atol=0)
    # stacked with a row-by-row part in one call (a fused layer whose parts differ)
    q8 = torch.from_numpy(random_blocks("Q8_0", 16, 768, seed=14)).reshape(-1).contiguous()
    both = ops.linear(x, [packed, q8], [gguf_cpu.Q4_1X8, gguf_cpu.TYPE_IDS["Q8_0"]], None)
    torch.testing.assert_close(both[:, :48], got, rtol=0, atol=0)
    with pytest.raises(ValueError, match="multiple of 8"):
        gguf_cpu.repack_q4_1_x8(raw[:12], type_name)


def test_the_interleaved_q8_0_layout_round_trips_and_multiplies_like_the_files():
    """Q8_0x8 (the default model's LM head, 8 rows interleaved): same bytes back, same products."""
    raw = torch.from_numpy(random_blocks("Q8_0", 48, 768, seed=15))
    packed = gguf_cpu.repack_q8_0_x8(raw)
    assert packed.numel() == raw.numel()
    assert torch.equal(gguf_cpu.unpack_q8_0_x8(packed, 48, 768), raw)
    ops = gguf_cpu.load()
    if ops.isa() == "portable":
        pytest.skip("the interleaved kernel is AVX2 code")
    x = torch.randn(6, 768, generator=torch.Generator().manual_seed(16))
    want = ops.linear(x, [raw.reshape(-1).contiguous()], [gguf_cpu.TYPE_IDS["Q8_0"]], None)
    got = ops.linear(x, [packed], [gguf_cpu.Q8_0X8], None)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    x9 = torch.randn(9, 768, generator=torch.Generator().manual_seed(17))
    batch = ops.linear(x9, [packed], [gguf_cpu.Q8_0X8], None)
    alone = torch.cat([ops.linear(x9[i : i + 1], [packed], [gguf_cpu.Q8_0X8], None) for i in range(9)])
    torch.testing.assert_close(batch, alone, rtol=0, atol=0)
    with pytest.raises(ValueError, match="multiple of 8"):
        gguf_cpu.repack_q8_0_x8(raw[:12])


def test_the_interleaved_q5_0_layout_round_trips_and_multiplies_like_the_files():
    """Q5_0x8 (most of Qwen2.5-Coder-0.5B's layers: 896 columns are no K-quant's multiple of 256): the
    high bits reordered per step come back as the file's words; the products equal the row kernel's."""
    raw = torch.from_numpy(random_blocks("Q5_0", 48, 768, seed=18))
    packed = gguf_cpu.repack_q5_0_x8(raw)
    assert packed.numel() == raw.numel()
    assert torch.equal(gguf_cpu.unpack_q5_0_x8(packed, 48, 768), raw)
    # one high bit alone: element 17 of row 3, block 0 -> step 0's byte (elements 16..19 in its high nibble)
    one = torch.zeros(8, 22, dtype=torch.uint8)
    one[3, 2 + 17 // 8] = 1 << (17 % 8)
    hb = gguf_cpu.repack_q5_0_x8(one)[16:48].reshape(8, 4)
    assert hb[3].tolist() == [1 << 5, 0, 0, 0] and int(hb.sum()) == 32
    ops = gguf_cpu.load()
    if ops.isa() == "portable":
        pytest.skip("the interleaved kernel is AVX2 code")
    x = torch.randn(6, 768, generator=torch.Generator().manual_seed(19))
    want = ops.linear(x, [raw.reshape(-1).contiguous()], [gguf_cpu.TYPE_IDS["Q5_0"]], None)
    got = ops.linear(x, [packed], [gguf_cpu.Q5_0X8], None)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    ref = x @ _ref("Q5_0", raw.numpy(), 768).T
    assert (got - ref).norm() / ref.norm() < ACT_TOL
    x9 = torch.randn(9, 768, generator=torch.Generator().manual_seed(20))
    batch = ops.linear(x9, [packed], [gguf_cpu.Q5_0X8], None)
    alone = torch.cat([ops.linear(x9[i : i + 1], [packed], [gguf_cpu.Q5_0X8], None) for i in range(9)])
    torch.testing.assert_close(batch, alone, rtol=0, atol=0)
    with pytest.raises(ValueError, match="multiple of 8"):
        gguf_cpu.repack_q5_0_x8(raw[:12])


@pytest.mark.default_model
def test_the_loader_dequantizes_a_real_file_like_gguf_py():
    """The loader's fast path (these kernels) gives gguf-py's floats, bit for bit, on every tensor of a real file."""
    import gguf as gguf_py

    from minillm.loader import resolve_model_path
    from minillm.loader.gguf import FAST_DEQUANT_TYPES, dequantize_tensor

    reader = gguf_py.GGUFReader(str(resolve_model_path(None)))
    fast = gguf_cpu.load().dequantize
    checked = 0
    for t in reader.tensors:
        ours = dequantize_tensor(t, fast)
        theirs = torch.from_numpy(np.asarray(dequantize_tensor(t, None)))
        if t.tensor_type in FAST_DEQUANT_TYPES and len(t.shape) == 2:
            assert isinstance(ours, torch.Tensor)
            checked += 1
        ours = ours if isinstance(ours, torch.Tensor) else torch.from_numpy(np.asarray(ours))
        assert torch.equal(ours.reshape(theirs.shape), theirs), t.name
    assert checked > 100  # the block tensors went through the kernels


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    # a process killed mid-build leaves cpp_extension's lock behind, and every later build waits on it forever
    import os
    import time

    from minillm.cpu.kernels.gguf_cpu import clear_stale_lock

    assert not clear_stale_lock(tmp_path)  # no lock: nothing to do
    lock = tmp_path / "lock"
    lock.touch()
    assert not clear_stale_lock(tmp_path) and lock.exists()  # fresh: another process may be building now
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="stale build lock"):
        assert clear_stale_lock(tmp_path)
    assert not lock.exists()
