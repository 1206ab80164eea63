"""Notebook 08's claims about quantization as checks that fail when a measurement contradicts them.

The source articles' four pitfalls and SmoothQuant's speed claim, each a function
of numbers the notebook measures on the reader's machine (minillm.bench.quant's
table, the GGUF file, real engines' preemption counts). tests/test_quant_claims.py
feeds each check a contradicting measurement and expects it to fail.
"""
from __future__ import annotations

import statistics
from typing import Mapping, Sequence

from minillm.host import cpu_flags
from minillm.quant.w8a8 import INT8_DOT_FLAGS

__all__ = ["AMX_FLAGS", "INT8_DOT_FLAGS", "best_of", "check_file_is_not_memory", "check_float_kv_outgrows_weights",
           "check_perplexity_hides_flips", "check_w8a8_gain", "cpu_flags"]

AMX_FLAGS = ("amx_bf16", "amx_int8")  # matrix units: bf16 tiles as well as int8 ones


def check_file_is_not_memory(file_bytes: int, held_bytes: int, predicted_held_bytes: int, allocated_bytes: int,
                             tolerance: float = 0.03, min_ratio: float = 1.5) -> float:
    """Pitfall 1: a model needs more memory than its file. The bytes the engine holds for the model must match
    the prediction from the file's tensors (what is kept as stored, what is widened) within `tolerance`, and
    weights + KV pool must exceed the file by `min_ratio`. Returns allocated / file."""
    if abs(held_bytes - predicted_held_bytes) > tolerance * held_bytes:
        raise AssertionError(f"held {held_bytes / 1e6:.1f} MB, predicted {predicted_held_bytes / 1e6:.1f} MB: "
                             f"the memory is not explained by the file's tensors")
    ratio = allocated_bytes / file_bytes
    if ratio < min_ratio:
        raise AssertionError(f"allocated {allocated_bytes / 1e6:.1f} MB is only {ratio:.2f}x the "
                             f"{file_bytes / 1e6:.1f} MB file (claim: at least {min_ratio}x)")
    return ratio


def check_float_kv_outgrows_weights(weight_bytes: int, kv_bytes_per_token: Mapping[str, int], tokens: int,
                                    preemptions: Mapping[str, int]) -> int:
    """Pitfall 2: with int4 weights, a float KV cache for `tokens` tokens in flight outweighs the weights, and
    an engine whose KV budget the int8 cache fits preempts with a float cache and not with int8. Returns the
    token count at which the float cache's bytes pass the weights'."""
    crossing = weight_bytes // kv_bytes_per_token["float"]
    if tokens * kv_bytes_per_token["float"] <= weight_bytes:
        raise AssertionError(f"{tokens} tokens of float KV ({tokens * kv_bytes_per_token['float'] / 1e6:.1f} MB) "
                             f"do not outweigh {weight_bytes / 1e6:.1f} MB of weights")
    if not preemptions["float"] > 0:
        raise AssertionError("the float KV cache never ran out: no preemption (claim: it runs out first)")
    if preemptions["int8"] != 0:
        raise AssertionError(f"the int8 KV cache preempted {preemptions['int8']} times in the same budget")
    return crossing


def check_perplexity_hides_flips(rows: Sequence, max_ppl_change_pct: float = 1.0) -> list[str]:
    """Pitfall 4: some quantized setting moves perplexity by less than `max_ppl_change_pct` % yet changes
    the verdict of at least one task item. rows: QuantSubjectRow-likes with setting, ppl_change_pct,
    task_flips. Returns those settings."""
    hidden = [r.setting for r in rows if r.setting != "float" and r.ppl_change_pct is not None
              and abs(r.ppl_change_pct) < max_ppl_change_pct and (r.task_flips or 0) >= 1]
    if not hidden:
        raise AssertionError(f"no setting within {max_ppl_change_pct}% perplexity flipped a task: perplexity "
                             f"hid nothing here")
    return hidden


def best_of(throughput: Mapping[str, float | None], names: Sequence[str]) -> tuple[str, float]:
    """(name, value) of the highest measured throughput among `names`."""
    got = [(n, throughput[n]) for n in names if throughput.get(n)]
    if not got:
        raise AssertionError(f"none of {list(names)} was measured")
    return max(got, key=lambda kv: kv[1])


def check_w8a8_gain(throughput: Mapping[str, float | None], flags: set[str],
                    gemm_gain: Sequence[float] = (), layer_gain: Mapping[str, Sequence[float]] | None = None,
                    min_gemm_gain: float = 1.6, tolerance: float = 0.15,
                    floats: Sequence[str] = ("float", "bf16"), w8a8: Sequence[str] = ("w8a8", "w8a8+bf16"),
                    amx_band: tuple[float, float] = (0.5, 1.3)) -> float:
    """SmoothQuant's speed claim on a CPU: W8A8 (its best setting) over the best float dtype (its best).
    Returns that gain.

    Where the CPU has int8 dot products but no matrix units (AVX-512 VNNI / AVX-VNNI without AMX), one int8
    multiply-add instruction does twice the work of a bf16 one. Two claims follow, each from a measurement:
    - the instruction claim, at the GEMM: torch._int_mm over the bf16 GEMM at the model's shapes
      (`gemm_gain`, one per shape and row count), median >= min_gemm_gain;
    - the batch's gain, from Amdahl: only the linears change between a W8A8 setting and the float setting
      with the same other ops (w8a8+bf16 vs bf16, w8a8 vs float), so that gain lies between
      min(1, the slowest layer's gain) and max(1, the fastest's), from `layer_gain` (the whole W8A8 layer,
      quantizing x and rescaling y included, over the float layer, per shape and row count), +-tolerance.
      The published 1.3x is a figure the notebook shows against this, not a bound: at a decode step's few
      rows the per-token passes over x and y eat most of the GEMM's gain.
    With AMX the bf16 tiles are as fast in practice and quantizing x per token is extra work: claim no win
    (gain below the band's top) and nothing broken (above its bottom). Without int8 dot products no claim
    is made (the gain is returned, not checked)."""
    best_float = best_of(throughput, floats)
    best_w8 = best_of(throughput, w8a8)
    gain = best_w8[1] / best_float[1]
    if flags & set(AMX_FLAGS):
        lo, hi = amx_band
        if not lo <= gain <= hi:
            raise AssertionError(f"with AMX, {best_w8[0]} / {best_float[0]} = {gain:.2f}x, outside the band "
                                 f"{lo}-{hi}x (claim: no win over bf16, and not broken)")
    elif flags & set(INT8_DOT_FLAGS):
        if not gemm_gain or not layer_gain:
            raise ValueError("with int8 dot products the claim needs the measured gemm_gain and layer_gain")
        gemm = statistics.median(gemm_gain)
        if gemm < min_gemm_gain:
            raise AssertionError(f"the int8 GEMM runs {gemm:.2f}x the bf16 GEMM (median over the model's shapes) "
                                 f"on a CPU with int8 dot products (claim: at least {min_gemm_gain}x)")
        for quantized, base in (("w8a8+bf16", "bf16"), ("w8a8", "float")):
            if not (throughput.get(quantized) and throughput.get(base) and layer_gain.get(base)):
                continue
            pair = throughput[quantized] / throughput[base]
            lo = min(1.0, min(layer_gain[base])) * (1 - tolerance)
            hi = max(1.0, max(layer_gain[base])) * (1 + tolerance)
            if not lo <= pair <= hi:
                raise AssertionError(f"{quantized} / {base} = {pair:.2f}x, outside {lo:.2f}-{hi:.2f}x: the range its "
                                     f"linears' measured gains allow (only the linears differ)")
    return gain
