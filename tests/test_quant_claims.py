"""Notebook 08's claim checks pass on measurements that agree and fail on ones that contradict them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from minillm.bench.quant_claims import (
    check_file_is_not_memory,
    check_float_kv_outgrows_weights,
    check_perplexity_hides_flips,
    check_w8a8_gain,
    cpu_flags,
)

MB = 10**6


def test_file_is_not_memory():
    # the default model's numbers: a 98 MB file, 209.8 MB held (the Q8_0 embedding widened to float32), + pool
    assert check_file_is_not_memory(98 * MB, 210 * MB, 209 * MB, 399 * MB) == pytest.approx(399 / 98)
    with pytest.raises(AssertionError, match="not explained"):
        check_file_is_not_memory(98 * MB, 210 * MB, 97 * MB, 399 * MB)  # memory the file does not account for
    with pytest.raises(AssertionError, match="only"):
        check_file_is_not_memory(98 * MB, 100 * MB, 100 * MB, 120 * MB)  # memory close to the file size


def test_float_kv_outgrows_weights():
    kv = {"float": 46080, "int8": 12240}
    assert check_float_kv_outgrows_weights(180 * MB, kv, 8 * 512, {"float": 3, "int8": 0}) == 180 * MB // 46080
    with pytest.raises(AssertionError, match="do not outweigh"):
        check_float_kv_outgrows_weights(180 * MB, kv, 1000, {"float": 3, "int8": 0})
    with pytest.raises(AssertionError, match="never ran out"):
        check_float_kv_outgrows_weights(180 * MB, kv, 8 * 512, {"float": 0, "int8": 0})
    with pytest.raises(AssertionError, match="int8 KV cache preempted"):
        check_float_kv_outgrows_weights(180 * MB, kv, 8 * 512, {"float": 3, "int8": 1})


def _row(setting, dppl, flips):
    return SimpleNamespace(setting=setting, ppl_change_pct=dppl, task_flips=flips)


def test_perplexity_hides_flips():
    rows = [_row("float", 0.0, 0), _row("int8", -0.17, 1), _row("int4 g64", 12.0, 4), _row("kv-int8", 0.3, 0)]
    assert check_perplexity_hides_flips(rows) == ["int8"]
    with pytest.raises(AssertionError, match="hid nothing"):  # small perplexity changes, no flips
        check_perplexity_hides_flips([_row("float", 0.0, 0), _row("int8", -0.17, 0), _row("int4 g64", 12.0, 4)])
    with pytest.raises(AssertionError, match="hid nothing"):  # flips only where perplexity moved a lot
        check_perplexity_hides_flips([_row("float", 0.0, 0), _row("int4 g64", 12.0, 4)])


def test_w8a8_gain_by_cpu_features():
    vnni, amx, avx2 = {"avx512_vnni", "avx512_bf16"}, {"avx512_vnni", "amx_bf16", "amx_int8"}, {"avx2", "fma"}
    tput = {"float": 100.0, "bf16": 220.0, "w8a8": 190.0, "w8a8+bf16": 300.0}
    gemm = [2.0, 2.1, 1.9, 2.2]  # int8 GEMM over bf16 GEMM per shape: the instruction claim holds
    layers = {"bf16": [0.8, 1.2, 1.5, 1.6], "float": [1.5, 2.0, 3.0, 4.0]}
    assert check_w8a8_gain(tput, vnni, gemm, layers) == pytest.approx(300 / 220)  # best w8a8 over the best float
    with pytest.raises(AssertionError, match="int8 GEMM runs"):
        check_w8a8_gain(tput, vnni, [1.0, 1.1, 0.9], layers)  # the integer units are no faster: claim broken
    with pytest.raises(AssertionError, match="w8a8\\+bf16 / bf16 = 0.50x"):
        check_w8a8_gain(tput | {"w8a8+bf16": 110.0}, vnni, gemm, layers)  # below every layer's gain: broken
    with pytest.raises(AssertionError, match="w8a8\\+bf16 / bf16 = 2.27x"):
        check_w8a8_gain(tput | {"w8a8+bf16": 500.0}, vnni, gemm, layers)  # above the fastest layer: not the linears
    with pytest.raises(AssertionError, match="w8a8 / float = 0.50x"):
        check_w8a8_gain(tput | {"w8a8": 50.0}, vnni, gemm, layers)
    with pytest.raises(ValueError, match="needs the measured"):
        check_w8a8_gain(tput, vnni)
    assert check_w8a8_gain(tput | {"w8a8+bf16": 230.0}, amx) == pytest.approx(230 / 220)  # parity with AMX
    with pytest.raises(AssertionError, match="outside the band"):
        check_w8a8_gain(tput, amx)  # 1.36x with AMX: a win the claim says does not happen
    with pytest.raises(AssertionError, match="outside the band"):
        check_w8a8_gain(tput | {"w8a8+bf16": 100.0, "w8a8": 90.0}, amx)  # under half of bf16: broken
    assert check_w8a8_gain(tput | {"w8a8+bf16": 100.0, "w8a8": 90.0}, avx2) < 1  # no int8 dot products: no claim
    with pytest.raises(AssertionError, match="none of"):
        check_w8a8_gain({"float": 100.0}, vnni, gemm, layers)


def test_cpu_flags_reads_this_machine():
    assert isinstance(cpu_flags(), set)
