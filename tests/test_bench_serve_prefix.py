"""`minillm bench serve` and `minillm bench prefix` on tiny random models: the JSON's shape, no timing claims.

What can fail here: every request of the serve workload must complete with
exactly the tokens it asked for (ignore_eos) and the percentiles must be
ordered; the prefix bench must find the shared prefix in the cache (whole
blocks) and compute fewer prompt tokens with it than without.
"""
from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch

from minillm.bench.cli import main
from minillm.bench.prefix import PrefixWorkload, measure_prefix, summarize_prefix, twin_engines
from minillm.bench.minillm_subject import MinillmSubject
from minillm.bench.report import jsonable
from minillm.bench.serve import ServeWorkload, run_clients, summarize_serve
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.server import create_app
from minillm.server.background import ServerThread
from tests.helpers.engine_utils import tiny_model
from tests.helpers.tiny_models import make_tiny_hf_model
from tests.test_server_helpers import MODEL_NAME, tiny_engine

TINY_SERVE = ServeWorkload(num_requests=10, prompt_len_range=(4, 24), output_len_range=(2, 9), max_concurrency=4)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _ordered(p: dict, floor_ok: bool = False) -> None:
    """Ordered percentiles, positive. floor_ok: they may be 0 (the gaps between a request's tokens, ITL and
    TPOT: events that reach the client in one read share a timestamp, and a fast engine sends several
    between two reads, or a short request's every token at once)."""
    assert p["p50"] <= p["p90"] <= p["p99"]
    assert (p["p50"] >= 0 and p["mean"] >= 0) if floor_ok else (p["p50"] > 0 and p["mean"] > 0)


def test_serve_workload_is_seeded_and_validated():
    a, b = TINY_SERVE.requests(320), TINY_SERVE.requests(320)
    assert a == b and len(a) == 10 and all(t == 0.0 for t, _, _ in a)
    poisson = ServeWorkload(num_requests=20, request_rate=5.0).requests(320)
    offsets = [t for t, _, _ in poisson]
    assert offsets == sorted(offsets) and offsets[-1] > 0
    with pytest.raises(ValueError, match="request_rate"):
        ServeWorkload(request_rate=0)
    with pytest.raises(ValueError, match="length range"):
        ServeWorkload(prompt_len_range=(5, 2))
    assert json.dumps(jsonable(ServeWorkload().to_dict()))  # inf is written as null


def test_serve_clients_against_a_live_server():
    engine = tiny_engine()
    with ServerThread(create_app(engine, model_name=MODEL_NAME)) as srv:
        records, wall = asyncio.run(run_clients(srv.url, MODEL_NAME, TINY_SERVE, 320))
        bad, _ = asyncio.run(run_clients(srv.url, "no-such-model", ServeWorkload(1, (4, 4), (2, 2)), 320))
    reqs = TINY_SERVE.requests(320)
    assert all(r.error is None for r in records), [r.error for r in records]
    assert [r.output_tokens for r in records] == [n for _, _, n in reqs]  # ignore_eos: exactly max_tokens
    assert [r.prompt_tokens for r in records] == [len(p) for _, p, _ in reqs]
    s = summarize_serve(records, wall)
    assert s["num_completed"] == 10 and s["num_errors"] == 0
    assert s["output_tokens"] == s["requested_output_tokens"] == sum(n for _, _, n in reqs)
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        _ordered(s[key], floor_ok=key in ("itl_s", "tpot_s"))
    assert s["e2e_s"]["p99"] >= s["ttft_s"]["p50"] and s["e2e_s"]["p99"] <= wall
    assert s["requests_per_s"] == pytest.approx(10 / wall)
    # a request the server refuses is reported as an error, not a crash of the benchmark
    assert bad[0].error and "404" in bad[0].error
    assert math.isnan(summarize_serve(bad, 1.0)["ttft_s"]["p50"])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks  # every request freed its blocks


def test_serve_cli_in_process(tmp_path, capsys):
    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    out = tmp_path / "serve.json"
    argv = ["serve", "--model", str(folder), "--num-requests", "6", "--prompt-len-range", "4", "16",
            "--output-len-range", "2", "6", "--max-concurrency", "3", "--kv-cache-mb", "4", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "serve" and report["num_completed"] == 6 and report["num_errors"] == 0
    assert report["machine"]["versions"]["torch"] == torch.__version__
    assert report["workload"]["num_requests"] == 6 and report["workload"]["request_rate"] is None
    assert report["settings"]["in_process"] is True
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(report[key]) == {"p50", "p90", "p99", "mean"}
    assert "TTFT" in capsys.readouterr().out


def _tiny_subject(block_size: int = 4) -> MinillmSubject:
    model = tiny_model(vocab=97, max_pos=512)
    engine = LLMEngine(model, None, [], EngineConfig(block_size=block_size, num_kv_blocks=64,
                                                     max_num_seqs=4, max_num_batched_tokens=512))
    return MinillmSubject(engine)


def test_prefix_bench_hits_the_shared_prefix():
    wl = PrefixWorkload(prefix_len=66, num_turns=3, turn_len_range=(5, 9), seed=1)
    warm, turns = wl.prompts(97)
    assert all(t[:66] == warm[:66] for t in turns) and len({tuple(t) for t in turns}) == 3
    subject = _tiny_subject()
    engines = twin_engines(subject, kv_cache_memory_bytes=1 << 20)
    assert engines["cached"].config.enable_prefix_caching and not engines["uncached"].config.enable_prefix_caching
    assert engines["cached"].model is engines["uncached"].model  # same weights, one copy
    raw = measure_prefix(engines, wl, 97)
    # 66 shared tokens = 16 full blocks of 4 (64 tokens) found per turn; the uncached engine finds none
    assert raw["prefix_hit_tokens"] == {"cached": 3 * 64, "uncached": 0}
    assert raw["computed_prompt_tokens"]["uncached"] == raw["turn_prompt_tokens"]
    assert raw["computed_prompt_tokens"]["cached"] == raw["turn_prompt_tokens"] - 3 * 64
    report = json.loads(json.dumps(jsonable(summarize_prefix(raw))))
    assert len(report["figures"]["cached"]["ttft_s"]["values"]) == 3
    assert report["ratios"]["computed_tokens_cut"] == pytest.approx(raw["turn_prompt_tokens"] / (raw["turn_prompt_tokens"] - 192))
    assert report["ratios"]["ttft_cut"] > 0
    assert report["targets"][0]["name"] == "prefix_ttft_cut" and isinstance(report["targets"][0]["passed"], bool)


def test_prefix_cli(tmp_path, capsys):
    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    out = tmp_path / "prefix.json"
    argv = ["prefix", "--model", str(folder), "--prefix-len", "40", "--num-turns", "2", "--turn-len-range", "3", "6",
            "--quiet", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "prefix" and report["workload"]["prefix_len"] == 40
    assert report["figures"]["cached"]["prefix_hit_tokens"] == 2 * 32  # two turns, 40 // 16 = 2 full blocks each
    assert report["settings"]["kv_cache_bytes"] > 0 and report["machine_state"]["before"]["stall_ratio"] > 0
    assert "TTFT cut" in capsys.readouterr().out


def test_prefix_workload_validates():
    with pytest.raises(ValueError):
        PrefixWorkload(prefix_len=0)
    with pytest.raises(ValueError):
        PrefixWorkload(turn_len_range=(9, 3))
