"""The course's headline claims as checks: each notebook asserts its measurement through one of these.

Why a module: issue 16 asks that every headline assert fail when fed a measurement that
contradicts the claim. Kept here, the notebooks call them on what they measured and
tests/test_course_claims.py feeds them contradicting numbers and expects the failure.
Each check raises AssertionError with the numbers in the message.
"""
from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minillm.bench.step_cost import Speedup


def check_paging_claim(paged_util: float, contig_util: float, peak_paged: int, peak_contig: int,
                       speedup: float, predicted: float, step_ratio: float, margin: float = 0.3) -> None:
    """Notebook 03 (Kwon et al., SOSP 2023): reservations keep 20-38% of their slots filled, paging
    nearly all; the pool then holds more sequences at once, and the same tokens take fewer, fuller
    steps, so more output tokens per second.

    speedup: paged over contiguous output tok/s (the same tokens, so contiguous over paged time);
    predicted: what the step-cost model fitted to the paged run's steps alone predicts for it
    (minillm/bench/step_cost.py); step_ratio: contiguous steps over paged steps, the speed-up if
    every step cost the same. The gain must be real (over 1.1x) and within `margin` of the model's
    prediction, which the contiguous run took no part in fitting."""
    assert contig_util < 0.40, f"reservations filled {contig_util:.0%} of their slots: not the 20-38% claimed"
    assert paged_util > 0.80, f"paging filled only {paged_util:.0%} of its slots"
    assert peak_paged >= 2 * peak_contig, f"paging ran {peak_paged} sequences at once vs {peak_contig}"
    assert step_ratio > 1.2, f"paging saved too few steps ({step_ratio:.2f}x) to test it"
    assert speedup > 1.1, f"paged/contiguous throughput {speedup:.2f}x: no real gain"
    assert abs(speedup / predicted - 1) <= margin, (
        f"paged/contiguous throughput {speedup:.2f}x, but the step-cost model predicts {predicted:.2f}x "
        f"(more than {margin:.0%} apart; the step counts alone predict {step_ratio:.2f}x)")


def check_continuous_claim(speedups: list[float], step_ratio: float, row_ratio: float, margin: float = 0.2) -> None:
    """Notebook 05 (Orca, OSDI 2022): continuous batching beats static batching because static
    batching keeps finished rows in the batch until its longest request ends.

    speedups: continuous over static output tok/s, one per repeat. The cost model brackets the
    gain: if a step costs the same whoever sits in it (decode bound by reading the weights), the
    speed-up is the ratio of steps, static over continuous (`step_ratio`); if a step costs in
    proportion to its rows (bound by arithmetic), it is the ratio of rows computed (`row_ratio`):
    every token position through the model, prompts and decodes alike, so static's padded prompt
    positions and its finished rows' decodes both count. The median must lie in that bracket,
    widened by `margin`, and above 1."""
    med = statistics.median(speedups)
    lo, hi = max(1.0, min(step_ratio, row_ratio) * (1 - margin)), max(step_ratio, row_ratio) * (1 + margin)
    assert min(step_ratio, row_ratio) > 1.1, f"the workload wastes too little ({step_ratio:.2f}x steps) to test it"
    assert lo < med <= hi, (
        f"continuous/static throughput {med:.2f}x (repeats {[round(s, 2) for s in speedups]}) outside "
        f"({lo:.2f}, {hi:.2f}]: the steps predict {step_ratio:.2f}x, the rows {row_ratio:.2f}x")


def check_batching_model(measured_ratio: float, overlap_ratio: float, serial_ratio: float,
                         margin: float = 0.15) -> None:
    """Notebook 00: t(8)/t(1), the batch-8 over the batch-1 decode step time, lies between what the
    step-cost model predicts with reading and computing fully overlapped (max of the two times) and
    not overlapped at all (their sum), within `margin`."""
    lo, hi = overlap_ratio * (1 - margin), serial_ratio * (1 + margin)
    assert lo <= measured_ratio <= hi, (
        f"t8/t1 = {measured_ratio:.2f} outside the cost model's [{lo:.2f}, {hi:.2f}] "
        f"(overlapped {overlap_ratio:.2f}, serial {serial_ratio:.2f}, margin {margin:.0%})")


def check_serving_tradeoff(gains: list[float], costs: list[float], concurrency: int, slack: float = 0.15) -> None:
    """Notebook 11 (Orca, OSDI 2022; vLLM, SOSP 2023): more requests in flight buy throughput with
    latency. gains: output tok/s at `concurrency` in flight over 1 in flight; costs: median e2e
    latency at `concurrency` over 1; one of each per repeat.

    Little's law ties the two: with c requests always in flight, throughput is c / e2e, so the gain
    is at most c / cost (less when the batch drains at the end of the run). The medians must show
    a real gain (more than 2x), a real cost (latency above 1x: batching is not free) and obey
    Little's law within `slack`."""
    gain, cost = statistics.median(gains), statistics.median(costs)
    spread = f"(repeats: gains {[round(g, 2) for g in gains]}, costs {[round(c, 2) for c in costs]})"
    assert gain > 2.0, f"{concurrency} in flight gave only {gain:.2f}x the throughput of 1 {spread}"
    assert cost > 1.0, f"median latency {cost:.2f}x at {concurrency} in flight: batching cost nothing? {spread}"
    bound = concurrency / cost * (1 + slack)
    assert gain <= bound, (f"throughput {gain:.2f}x exceeds Little's law's {concurrency}/{cost:.2f} = "
                           f"{concurrency / cost:.2f}x (+{slack:.0%}) {spread}")


def check_calibration_domain(dppl: dict[tuple[str, str, str], float], methods: tuple[str, ...],
                             min_gain: dict[str, float | None], noise: float = 0.5,
                             rounding_noise: float = 1.5) -> None:
    """Notebook 08 (the source articles' calibration-domain pitfall): a quantizer calibrated on text
    unlike the traffic loses more on that traffic -- where its rounding is coarse enough to matter.

    dppl[(method, calibrated on, scored on)]: perplexity change vs float in %, for calibration and
    scoring texts "prose" and "code". A method with a bound: on code, the code-calibrated copy must
    lose at least `min_gain[method]` points less than the prose-calibrated one, and on prose calibrating
    on code must not win by more than `noise` points (the mismatch never helps). A method with None
    (w8a8: 8-bit weights and activations) is claimed insensitive: on either text the two copies differ
    by less than `rounding_noise` points, the size of the swing that the float32 GEMM's rounding alone
    gives it (notebook 08 states the measurement)."""
    for m in methods:
        gain = dppl[m, "prose", "code"] - dppl[m, "code", "code"]
        won = dppl[m, "prose", "prose"] - dppl[m, "code", "prose"]
        if min_gain[m] is None:
            for text, d in (("code", gain), ("prose", won)):
                assert abs(d) < rounding_noise, (
                    f"{m}: on {text}, the calibration text moved perplexity by {d:+.2f} points, more than the "
                    f"{rounding_noise} that rounding alone explains: the domain matters at this precision")
            continue
        assert gain > min_gain[m], (
            f"{m}: on code, calibrating on code saved {gain:.2f} points of perplexity, not > {min_gain[m]} "
            f"(prose-calibrated {dppl[m, 'prose', 'code']:+.2f}%, code-calibrated {dppl[m, 'code', 'code']:+.2f}%)")
        assert won < noise, f"{m}: on prose, calibrating on code won by {won:.2f} points: the mismatch helped?"


def check_roofline_claim(decode1_intensity: float, decode_max_intensity: float, prefill_intensity: float,
                         ridge: float, min_growth: float = 10.0) -> None:
    """Notebook 01 (Yuan et al., *LLM Inference Unveiled: Survey and Roofline Model Insights*, 2024):
    decode at small batch is memory-bound and prefill compute-bound, and batching moves decode
    toward the ridge.

    Intensities in FLOP per byte: batch-1 decode, the largest decode batch (32 in the notebook) and
    a 512-token prefill; ridge: this machine's peak FLOP/s over its bandwidth. Batch-1 decode must
    lie left of the ridge and the prefill right of it; the largest batch must reach more than
    `min_growth` times batch 1's intensity (the same weights read for that many more tokens)."""
    assert decode1_intensity < ridge, (
        f"batch-1 decode at {decode1_intensity:.2f} FLOP/byte is not left of the ridge ({ridge:.2f}): not memory-bound")
    assert prefill_intensity > ridge, (
        f"the prefill at {prefill_intensity:.2f} FLOP/byte is not right of the ridge ({ridge:.2f}): not compute-bound")
    # about linear in the batch: 32 sequences share one weight read; attention's own bytes keep it below 32x
    growth = decode_max_intensity / decode1_intensity
    assert growth > min_growth, (
        f"the largest decode batch reached {decode_max_intensity:.2f} FLOP/byte, only {growth:.1f}x batch 1's "
        f"{decode1_intensity:.2f}: not > {min_growth:g}x")


def check_kv_heads_capacity(kv_heads: dict[str, int], blocks: dict[str, int], peak_running: dict[str, int],
                            slack_blocks: int = 3) -> None:
    """Notebook 02 (Ainslie et al., *GQA*, EMNLP 2023; Shazeer, *MQA*, 2019): fewer K/V heads,
    proportionally more sequences -- the cache shrinks by the ratio of K/V heads.

    Per layout "MHA", "GQA", "MQA" under the same KV memory budget: its K/V heads, the blocks its
    pool received and the peak number of sequences running at once. GQA must fit the MHA pool's
    blocks times the head ratio (less `slack_blocks` for rounding) and run more sequences than MHA;
    MQA at least as many as GQA (the workload's request count may cap both)."""
    want = blocks["MHA"] * kv_heads["MHA"] // kv_heads["GQA"]
    assert blocks["GQA"] + slack_blocks >= want, (
        f"GQA ({kv_heads['GQA']} kv heads) got {blocks['GQA']} blocks, MHA ({kv_heads['MHA']}) {blocks['MHA']}: "
        f"not the {kv_heads['MHA'] / kv_heads['GQA']:g}x the head ratio gives ({want} - {slack_blocks})")
    assert peak_running["GQA"] > peak_running["MHA"], (
        f"GQA ran {peak_running['GQA']} sequences at once, MHA {peak_running['MHA']}: the larger pool bought nothing")
    assert peak_running["MQA"] >= peak_running["GQA"], (
        f"MQA ran {peak_running['MQA']} sequences at once, fewer than GQA's {peak_running['GQA']}")


def check_kv_heads_decode(ratios: list[float], predicted: float, model_margin: float = 0.25,
                          min_predicted: float = 1.2, noise_mads: float = 3.0) -> None:
    """Notebook 02: GQA's decode step against MHA's, t(MHA) / t(GQA), measured as interleaved repeats
    on one pinned thread, must match what the step-cost model predicts from the bytes a decode step
    reads (weights + K/V, from the engine's trace): predicted = bytes(MHA) / bytes(GQA).

    The band around the prediction is `model_margin` (the byte model ignores the fixed per-step cost,
    which pulls the ratio toward 1, and the paged gather reading K/V slower than weights stream, which
    pushes it up), widened by the repeats' own noise: `noise_mads` median absolute deviations of
    `ratios` (robust: one repeat hit by a burst of load does not widen it). The median must also show
    a gain (> 1), and the workload must predict a clear one (> `min_predicted`), or it cannot tell a
    gain from noise."""
    assert predicted > min_predicted, (
        f"the byte model predicts only {predicted:.2f}x: the K/V read is too small a part of a step to test the claim")
    med = statistics.median(ratios)
    rel = noise_mads * statistics.median(abs(r - med) for r in ratios) / med
    lo = max(1.0, predicted / (1 + model_margin) * (1 - rel))
    hi = predicted * (1 + model_margin) * (1 + rel)
    assert lo < med <= hi, (
        f"GQA decode {med:.2f}x MHA's (repeats {[round(r, 2) for r in ratios]}) outside ({lo:.2f}, {hi:.2f}] "
        f"around the {predicted:.2f}x the bytes read per step predict (margin {model_margin:.0%}, "
        f"noise {rel:.0%})")


def check_prefix_reuse(hit_tokens: int, shared_tokens: int, repeats: int, computed_cached: int, computed_plain: int,
                       block_size: int = 16) -> None:
    """Notebook 06 (SGLang's RadixAttention, Zheng et al., 2024; vLLM's automatic prefix caching):
    a cached prefix is not computed again, which cuts time to first token.

    hit_tokens: prompt tokens the cached engine found in its cache; shared_tokens: the prefix every
    prompt shares; repeats: requests after the one that filled the cache. Each repeat must find at
    least the shared prefix's full blocks (a partial block is never cached), and the cached engine
    must compute fewer prompt tokens than the engine without a cache (computed_cached vs
    computed_plain, after the warm-up)."""
    floor = repeats * (shared_tokens // block_size) * block_size
    assert hit_tokens >= floor, (
        f"{hit_tokens} prompt tokens hit the cache, fewer than {repeats} requests x "
        f"{shared_tokens // block_size * block_size} = {floor}: the shared prefix's full blocks")
    assert computed_cached < computed_plain, (
        f"with the cache {computed_cached} prompt tokens computed, without it {computed_plain}: it saved nothing")


def check_chat_reuse(hit_rate: dict[str, float], ttft_p50: dict[str, float], outputs_identical: bool,
                     min_hit_rate: float = 0.5, min_ttft_gain: float = 2.0) -> None:
    """Notebook 06 (RadixAttention, Zheng et al., 2024): a multi-turn chat reuses its history --
    every turn's prompt is the conversation so far plus a new message.

    hit_rate and ttft_p50 (median TTFT, seconds) per engine "none", "hash", "radix". Without a cache
    nothing hits; with either cache at least `min_hit_rate` of the prompt tokens must hit (about 3/4
    expected; a cache that lost the history between turns hits only the system prompt) and the
    median TTFT must drop at least `min_ttft_gain`x. Caching changes what is computed, never the
    greedy answers."""
    assert hit_rate["none"] == 0, f"the engine without a cache reports a hit rate of {hit_rate['none']:.2f}"
    for name in ("hash", "radix"):
        assert hit_rate[name] >= min_hit_rate, (
            f"{name}: hit rate {hit_rate[name]:.2f} < {min_hit_rate}: the history was not reused between turns")
        gain = ttft_p50["none"] / ttft_p50[name]
        assert gain >= min_ttft_gain, (
            f"{name}: median TTFT {ttft_p50['none'] * 1e3:.0f} ms without a cache -> {ttft_p50[name] * 1e3:.0f} ms, "
            f"only {gain:.2f}x lower (< {min_ttft_gain}x)")
    assert outputs_identical, "the greedy outputs differ between the engines: caching changed the answers"


def check_chunked_prefill(stalls_unchunked_s: list[float], stalls_chunked_s: list[float],
                          max_prefill_tokens_chunked: int, chunk: int, steps_over_budget: int,
                          noise_factor: float = 3.0) -> None:
    """Notebook 07 (Agrawal et al., *Sarathi-Serve*, OSDI 2024): chunked prefill bounds decode stalls.

    Four requests decode when a 768-token prompt arrives. stalls_*_s: the decoding requests' worst
    inter-token latency, one per repeat, without chunking (the whole prompt in one step) and with
    `chunk`-token chunks; max_prefill_tokens_chunked: the most prompt tokens any chunked step
    computed; steps_over_budget: steps, in all runs, that computed more tokens than their token
    budget. No step may exceed its budget, no chunk `chunk`.

    The stall bound comes from the measurement's own spread: chunking must shorten the median
    worst stall by more than `noise_factor` x the larger median absolute deviation of the two sets
    of repeats (the run-to-run noise; one slow repeat moves neither the median nor the MAD much).
    Without an effect the medians differ by noise alone and the check fails."""
    assert steps_over_budget == 0, f"{steps_over_budget} steps computed more tokens than their budget"
    assert max_prefill_tokens_chunked <= chunk, (
        f"a chunked step computed {max_prefill_tokens_chunked} prompt tokens, more than the {chunk}-token chunk")
    assert len(stalls_unchunked_s) >= 3 and len(stalls_chunked_s) >= 3, "repeat each run at least 3 times"
    med_u, med_c = statistics.median(stalls_unchunked_s), statistics.median(stalls_chunked_s)
    mad = lambda xs, m: statistics.median(abs(x - m) for x in xs)
    noise = max(mad(stalls_unchunked_s, med_u), mad(stalls_chunked_s, med_c))
    ms = lambda xs: [round(x * 1e3) for x in xs]
    assert med_u - med_c > noise_factor * noise, (
        f"median worst decode stall {med_c * 1e3:.0f} ms with {chunk}-token chunks (repeats {ms(stalls_chunked_s)}), "
        f"{med_u * 1e3:.0f} ms without (repeats {ms(stalls_unchunked_s)}): {(med_u - med_c) * 1e3:.0f} ms shorter, "
        f"not more than {noise_factor:g} x the noise ({noise * 1e3:.0f} ms median absolute deviation)")


def check_prefix_ttft(plain_s: list[float], cached_s: list[float], suffix_s: list[float], min_gain: float = 2.0,
                      tolerance: float = 0.3) -> None:
    """Notebook 06 (vLLM's automatic prefix caching; RadixAttention, Zheng et al., 2024): a cached
    prefix cuts time to first token, because a prompt whose prefix is cached costs what its suffix
    alone would cost.

    TTFT in seconds, one per repeat, each a single prefill with no queueing: plain_s, the whole
    prompt without a cache (P + S tokens computed); cached_s, the same prompt with its P-token
    prefix cached (S computed); suffix_s, an uncached prompt of only the S suffix tokens -- the
    prediction for cached_s (the cached run adds only attention over the P cached keys). The
    median gain plain / cached must reach `min_gain` and lie within `tolerance` of the predicted
    plain / suffix."""
    med = statistics.median
    gain, predicted = med(plain_s) / med(cached_s), med(plain_s) / med(suffix_s)
    ms = lambda xs: [round(x * 1e3) for x in xs]
    spread = f"(repeats ms: no cache {ms(plain_s)}, cached {ms(cached_s)}, suffix alone {ms(suffix_s)})"
    assert gain >= min_gain, f"the cached prefix cut the median TTFT only {gain:.2f}x, not >= {min_gain:g}x {spread}"
    assert abs(gain / predicted - 1) <= tolerance, (
        f"the cache cut the median TTFT {gain:.2f}x, but computing the suffix alone predicts {predicted:.2f}x: "
        f"off by more than {tolerance:.0%} {spread}")


def check_under_roofs(fractions: dict[str, float], limit: float = 1.0) -> None:
    """Notebook 01 (roofs are upper bounds, issue 16): every plotted step's achieved FLOP/s is at most
    its roof, min(peak, bandwidth x intensity), measured at the run's thread count -- the bandwidth
    roof the faster of a read and a copy, the compute roof the best of several GEMM shapes including
    the model's own prefill products. fractions: step label -> achieved / roof."""
    above = {k: round(v, 3) for k, v in fractions.items() if v > limit}
    assert fractions, "no plotted step to check"
    assert not above, f"steps above {limit:.0%} of their roof (the roof underestimates this machine): {above}"


def check_moe_compute(moe_flops: float, dense_flops: float, mixtral_params: float, mixtral_active: float,
                      max_ratio: float = 0.4, paper: tuple[float, float] = (46.7e9, 12.9e9), tol: float = 0.05e9) -> None:
    """Notebook 13 (Shazeer et al., 2017; Fedus et al., *Switch Transformers*, 2021; Jiang et al.,
    *Mixtral of Experts*, 2024): a top-k MoE costs a token the compute of its k active experts while
    holding all E experts' parameters.

    moe_flops, dense_flops: one decode step of the tiny top-2-of-8 model and of a dense model with
    the same total parameters (one MLP as wide as all experts); the MoE must cost less than
    `max_ratio` of it (k/E = 1/4, plus attention and the routers). mixtral_params, mixtral_active:
    Mixtral 8x7B's total and per-token parameters by the same counting, within `tol` of the paper's."""
    assert moe_flops < max_ratio * dense_flops, (
        f"the MoE decode step cost {moe_flops / dense_flops:.2f}x a dense model of the same parameters, "
        f"not < {max_ratio}: it pays for more than its active experts")
    assert abs(mixtral_params - paper[0]) < tol and abs(mixtral_active - paper[1]) < tol, (
        f"Mixtral 8x7B counted {mixtral_params / 1e9:.2f}B parameters, {mixtral_active / 1e9:.2f}B active; "
        f"the paper: {paper[0] / 1e9:.1f}B, {paper[1] / 1e9:.1f}B")


def check_router_imbalance(cvs: list[float], uniform_cv: float, factor: float,
                           simulated_p95: float | None = None) -> None:
    """Notebook 13 (Switch Transformers' load-balancing loss): nothing in top-k routing balances the
    load -- an untrained router is far from uniform.

    cvs: coefficient of variation of the experts' token counts, per layer (or per step);
    uniform_cv: what uniform routing of the same assignments gives, sqrt((E - k) / (k T)). Every CV
    must exceed `factor` x that. simulated_p95: where given, the 95th percentile of simulated
    uniform routings, which must stay within 2x the formula (the yardstick itself is right)."""
    if simulated_p95 is not None:
        assert simulated_p95 < 2 * uniform_cv, (
            f"simulated uniform routing reached CV {simulated_p95:.3f}, over 2x the formula's {uniform_cv:.3f}")
    assert min(cvs) > factor * uniform_cv, (
        f"a CV of {min(cvs):.3f} is within {factor:g}x of uniform routing's {uniform_cv:.3f}: "
        f"the router balanced the load (all: {[round(c, 3) for c in cvs]})")


def check_length_aware_tail(short_p99_s: dict[str, float], short_p99_steps: dict[str, float],
                            long_e2e_p99_steps: dict[str, float], outputs_identical: bool, factor: float = 3.0) -> None:
    """Notebook 12 (the serving guides' remedy for a slow tail: priority queues, or lanes split by
    expected output length): split by expected length and the short requests' P99 TTFT improves.

    Per policy "fcfs", "priority", "length-aware": the short requests' P99 TTFT in seconds (median
    over repeats) and in steps, and the long requests' P99 e2e in steps. Length-aware must cut the
    short P99 at least `factor`x against fcfs, in seconds and in steps (about 5-10x expected: a long
    generation's length over a short one's); priority, whose short requests still wait for running
    long ones, may help but not by `factor`; the long requests pay (their P99 e2e grows); the
    greedy outputs are the same under every policy."""
    gain_s = short_p99_s["fcfs"] / short_p99_s["length-aware"]
    gain_steps = short_p99_steps["fcfs"] / short_p99_steps["length-aware"]
    assert gain_s >= factor, (f"length-aware cut the short P99 TTFT only {gain_s:.1f}x in seconds "
                              f"({short_p99_s['fcfs']:.2f} s -> {short_p99_s['length-aware']:.2f} s), not >= {factor}x")
    assert gain_steps >= factor, (f"length-aware cut the short P99 TTFT only {gain_steps:.1f}x in steps "
                                  f"({short_p99_steps['fcfs']} -> {short_p99_steps['length-aware']}), not >= {factor}x")
    # priority: the right direction, but without reserved seats its short requests wait for running long ones
    assert short_p99_steps["priority"] <= short_p99_steps["fcfs"], (
        f"priority made the short P99 worse: {short_p99_steps['fcfs']} -> {short_p99_steps['priority']} steps")
    assert short_p99_steps["fcfs"] / short_p99_steps["priority"] < factor, (
        f"priority cut the short P99 {short_p99_steps['fcfs'] / short_p99_steps['priority']:.1f}x without reserved "
        f"seats: the workload does not show why they are needed")
    assert long_e2e_p99_steps["length-aware"] > long_e2e_p99_steps["fcfs"], (
        f"the long requests' P99 e2e did not grow under length-aware ({long_e2e_p99_steps['fcfs']} -> "
        f"{long_e2e_p99_steps['length-aware']} steps): fewer long seats should cost them")
    assert outputs_identical, "the greedy outputs differ between policies: scheduling changed which tokens"


def check_tp_kv_split(kv_bytes_one_rank: int, kv_bytes_per_rank: int, ranks: int) -> None:
    """Notebook 10 (Megatron-LM, Shoeybi et al., 2019): split by KV heads, each of N ranks holds 1/N
    of the KV cache -- the same blocks cost each rank exactly a third of one rank's pool at N = 3."""
    assert kv_bytes_per_rank * ranks == kv_bytes_one_rank, (
        f"each of {ranks} ranks holds {kv_bytes_per_rank:,} bytes of KV pool, one rank alone {kv_bytes_one_rank:,}: "
        f"not 1/{ranks}")


def check_tp_same_tokens(same: list[bool], max_logprob_diff: float, tol: float = 1e-3) -> None:
    """Notebook 10: tensor parallelism changes where the sums are computed, not the result -- every
    prompt's greedy tokens match one rank's, and the chosen tokens' log-probs agree within `tol`
    (the all-reduce adds the partial sums in another order)."""
    assert all(same), f"greedy tokens differ from one rank's on prompts {[i for i, s in enumerate(same) if not s]}"
    assert max_logprob_diff < tol, f"chosen tokens' log-probs differ by up to {max_logprob_diff:.1e}, not < {tol:g}"


def check_tp_allreduce(per_token_bytes: float, num_layers: int, hidden_size: int, bytes_per_element: int,
                       steps_off_formula: int) -> None:
    """Notebook 10 (Megatron-LM): a forward pass costs 2 all-reduces per layer of tokens x hidden
    activations (one after attention's row-parallel output projection, one after the MLP's), plus
    one for the vocabulary-split embedding: (2 L + 1) x hidden x b bytes per token.

    per_token_bytes: what one decoded token all-reduced, from the step trace; steps_off_formula:
    traced steps whose all-reduce bytes differ from the analytic payload."""
    assert steps_off_formula == 0, f"{steps_off_formula} steps all-reduced other than the analytic payload"
    want = (2 * num_layers + 1) * hidden_size * bytes_per_element
    assert per_token_bytes == want, (
        f"a decoded token all-reduced {per_token_bytes:,.0f} bytes, not (2 x {num_layers} + 1) x {hidden_size} x "
        f"{bytes_per_element} = {want:,}")


def check_tp_links(speedups: list[tuple[float, float]]) -> None:
    """Notebook 10 (why vLLM and TensorRT-LLM keep TP inside an NVLink domain): over PCIe the
    all-reduces eat much of the gain. speedups: (over NVLink, over PCIe) per model and workload at
    the same TP degree, from the step-cost model; NVLink must come out ahead in every one."""
    behind = [(round(nv, 2), round(pc, 2)) for nv, pc in speedups if not nv > pc]
    assert not behind, f"NVLink not ahead of PCIe in (NVLink, PCIe) speed-ups {behind}"


def check_decode_intensity(traced_intensity: float, group: int, bytes_per_element: int) -> None:
    """Notebook 04: the decode kernel's arithmetic intensity, counted from its recorded run (FLOPs of
    the unmasked scores over the bytes of the K/V rows its programs loaded), is the formula's 2G/b
    -- G query heads per KV head, b bytes per cached element -- whatever the context length."""
    want = 2 * group / bytes_per_element
    assert abs(traced_intensity - want) < 1e-9, (
        f"the traced decode kernel did {traced_intensity:.4f} FLOP per byte of K/V, not 2G/b = {want:.4f}: "
        f"it loaded K/V rows it did not use, or skipped some")


def check_attention_roofline(decode_intensity: float, prefill_intensity: float, ridge: float) -> None:
    """Notebook 04 (the attention kernels on the roofline, counted as in notebook 01): decode
    attention is memory-bound, a long prefill compute-bound.

    decode_intensity: FLOP per byte of decode attention (2G/b, any context or batch);
    prefill_intensity: that of a 512-token prefill with Q, K, V and O crossing memory once;
    ridge: this machine's peak FLOP/s over its bandwidth. Decode must lie left of it, the prefill
    right of it."""
    assert decode_intensity < ridge, (
        f"decode attention at {decode_intensity:.2f} FLOP/byte is not left of the ridge ({ridge:.2f})")
    assert prefill_intensity > ridge, (
        f"a 512-token prefill at {prefill_intensity:.2f} FLOP/byte is not right of the ridge ({ridge:.2f})")


def check_same_tokens(tokens: list[int], reference: list[int], what: str = "the Triton backend") -> None:
    """Notebook 04 (and any backend swap): a different attention backend computes the same greedy
    tokens as the torch reference -- the kernels change how attention is computed, not its result."""
    assert list(tokens) == list(reference), (
        f"{what} gave {list(tokens)}, the torch backend {list(reference)}: greedy tokens differ")


def check_speculation_emits(tokens_per_step: list[float], best_tokens_per_step: float, min_best: float = 1.5) -> None:
    """Notebook 09 (Leviathan et al., ICML 2023; Chen et al., 2023): speculative decoding's speed-up
    follows acceptance -- each verify step emits the target's own token plus the accepted guesses.

    tokens_per_step: tokens emitted per sequence per decode step, one per (batch, proposer) row,
    plain decoding included; best_tokens_per_step: that of the proposer with the best speed-up at
    batch 1. No row may emit less than one token per step (a verify always keeps the target's
    token), and the best proposer must emit more than `min_best` (its guesses are accepted)."""
    low = [round(t, 2) for t in tokens_per_step if t < 1.0]
    assert not low, f"decode steps emitted {low} tokens per sequence: fewer than the one a verify always keeps"
    assert best_tokens_per_step > min_best, (
        f"the best proposer at batch 1 emitted {best_tokens_per_step:.2f} tokens per step, not > {min_best}: "
        f"its guesses were rarely accepted")


def check_speculation_batch(speedups: dict[str, tuple[Speedup, Speedup]], min_gain: float = 1.1,
                            min_drop: float = 0.1, noise_factor: float = 2.0) -> None:
    """Notebook 09 (Leviathan et al., ICML 2023; the source articles): speculation spends compute a
    batch-1 decode step leaves idle, so its gain shrinks as the batch grows.

    speedups[proposer] = (at batch 1, at the large batch): speculative over plain decode, each run's
    time summed over its fastest steps across the repeats (a busy neighbour slows steps, never
    speeds them up; the greedy schedule is the same in every repeat). Some proposer must gain at
    batch 1 (above `min_gain`), and each that does must lose at least `min_drop` of its speed-up at
    the large batch, and more than `noise_factor` x the two speed-ups' sensitivity to any one repeat
    (the range of their leave-one-out values). Without an effect the two differ by noise alone."""
    gaining = {p: s for p, s in speedups.items() if s[0].value > min_gain}
    assert gaining, (f"no proposer gained more than {min_gain}x at batch 1: "
                     f"{ {p: round(s[0].value, 2) for p, s in speedups.items()} }")
    for proposer, (small, large) in gaining.items():
        assert len(small.leave_one_out) >= 3 and len(large.leave_one_out) >= 3, "repeat each run at least 3 times"
        noise = small.sensitivity + large.sensitivity
        assert small.value - large.value > max(min_drop, noise_factor * noise), (
            f"{proposer}: speed-up {large.fmt()} at the large batch vs {small.fmt()} at batch 1: not smaller by "
            f"{min_drop:g} and by more than {noise_factor:g} x the repeats' sway ({noise:.2f})")


def check_draft_pair(code_acceptance: list[float], speedups: list[tuple[float, float]], min_acceptance: float = 0.7,
                     tolerance: float = 0.25, break_even_margin: float = 0.05) -> None:
    """Notebook 09's real draft (Qwen2.5-Coder-0.5B for 1.5B; the source articles: a same-family draft
    accepts 0.7-0.8): on code completion the draft's acceptance exceeds `min_acceptance` at every k,
    and the cost model S = E / (k c + v), fed the measured acceptance profile and step costs,
    explains the speed-up measured end to end.

    speedups: (measured, predicted) per workload and k. Each measured speed-up must lie within
    `tolerance` of its prediction (medians against means), and where the model predicts a loss
    (below 1 - margin) the measurement must not show a gain (above 1 + margin)."""
    assert min(code_acceptance) > min_acceptance, (
        f"the same-family draft accepted {min(code_acceptance):.2f} on code, not > {min_acceptance} "
        f"(all k: {[round(a, 2) for a in code_acceptance]})")
    for measured, predicted in speedups:
        assert abs(measured / predicted - 1) < tolerance, (
            f"measured x{measured:.2f} vs the cost model's x{predicted:.2f}: off by more than {tolerance:.0%}")
        if predicted < 1 - break_even_margin:  # which side of break-even: what the model says
            assert measured < 1 + break_even_margin, (
                f"the cost model predicts a loss (x{predicted:.2f}) but the measurement shows x{measured:.2f}")


def check_medusa_heads(head1_by_domain: dict[str, float], untrained_head1: float, k1_verify_vs_rows: float,
                       speedups: list[tuple[float, float]], min_lift: float = 0.05, max_k1_cost: float = 1.3,
                       tolerance: float = 0.3) -> None:
    """Notebook 09's Medusa heads (Cai et al., ICML 2024), trained for minutes on the model's answers to
    Python questions and everyday ones: on questions never trained on, head 1 (the t+2 guess) is
    accepted more than `min_lift` more often than an untrained head's held-out top-1 in each kind of
    text; a k = 1 verify step costs under `max_k1_cost` plain steps of the same 2 rows (two sequences
    decoded together: its rows go through the paged-decode kernel, and the heads' guesses share its
    LM-head pass; what a second row adds to a step is the CPU's business, so it is the yardstick,
    not a 1-row step); and the cost model
    (1 + sum of the chain acceptances) x decode step / verify step predicts each measured speed-up
    within `tolerance`. speedups: (measured, predicted) per domain and k."""
    for domain, head1 in head1_by_domain.items():
        assert head1 > untrained_head1 + min_lift, (
            f"head 1 accepted {head1:.2f} on {domain}, not > an untrained head's {untrained_head1:.2f} + {min_lift}: "
            f"the training did not take there")
    assert k1_verify_vs_rows < max_k1_cost, (
        f"a k = 1 verify step cost {k1_verify_vs_rows:.2f} plain 2-row steps, not < {max_k1_cost}: a second pass "
        f"over the LM head, or the verify rows off the decode kernel?")
    for measured, predicted in speedups:
        assert abs(measured / predicted - 1) < tolerance, (
            f"Medusa measured x{measured:.2f} vs the cost model's x{predicted:.2f}: off by more than {tolerance:.0%}")


def check_hydra_heads(hydra_head1: dict[str, float], medusa_head1: dict[str, float],
                      speedups: list[tuple[float, float]], min_lift: float = 0.05, tolerance: float = 0.3) -> None:
    """Notebook 09's Hydra heads (Ankner et al., 2024: Medusa heads that also read the tokens guessed
    before them): on the same prompts, head 1 (the t+2 guess, which now knows token t+1) is accepted
    more than `min_lift` more often than Medusa's head 1 in each kind of text, and the cost model
    (1 + sum of the chain acceptances) x decode step / verify step predicts each measured speed-up
    within `tolerance`. speedups: (measured, predicted) per domain and k."""
    for domain, head1 in hydra_head1.items():
        assert head1 > medusa_head1[domain] + min_lift, (
            f"Hydra's head 1 accepted {head1:.2f} on {domain}, not > Medusa's {medusa_head1[domain]:.2f} + {min_lift}: "
            f"reading token t+1 did not help there")
    for measured, predicted in speedups:
        assert abs(measured / predicted - 1) < tolerance, (
            f"Hydra measured x{measured:.2f} vs the cost model's x{predicted:.2f}: off by more than {tolerance:.0%}")
