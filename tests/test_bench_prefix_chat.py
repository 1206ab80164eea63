"""`minillm bench prefix --workload chat` on tiny random models: the JSON's shape and the caches' hits, no timing claims.

What can fail here: every turn must extend its conversation's previous turn (system prompt,
earlier messages, the engine's own answers); the three engines must give the same greedy
answers; the caches must find whole blocks and the no-cache engine none; the pool must be
small enough that both caches evict.
"""
from __future__ import annotations

import json

import pytest

from minillm.bench.cli import main
from minillm.bench.prefix_chat import ChatWorkload, chat_engines, measure_chat, run_chat, summarize_chat
from minillm.bench.report import jsonable
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from tests.helpers.engine_utils import tiny_model
from tests.helpers.tiny_models import make_tiny_hf_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY_CHAT = ChatWorkload(system_len=24, num_conversations=4, num_turns=3, user_len_range=(3, 8), answer_len=6,
                         concurrency=2, pool_fraction=0.5, seed=1)


def test_chat_turns_extend_their_conversation():
    base = LLMEngine(tiny_model(vocab=97), None, [], EngineConfig(block_size=4, num_kv_blocks=256,
                                                                 max_num_batched_tokens=256))
    seen: dict[str, list[int]] = {}
    add = base.add_request

    def spy(rid, prompt, params):
        seen[rid] = list(prompt)
        return add(rid, prompt, params)

    base.add_request = spy
    raw = run_chat(base, TINY_CHAT, 97)
    system, users = TINY_CHAT.messages(97)
    for c in range(4):
        for t in range(3):
            p = seen[f"chat-{c}-{t}"]
            assert p[:24] == system and p[-len(users[c][t]):] == users[c][t]
            if t:  # the previous turn's prompt and answer, then the new message
                prev = f"chat-{c}-{t - 1}"
                assert p == seen[prev] + raw["outputs"][prev] + users[c][t]
    assert raw["prompt_tokens"] == sum(len(p) for p in seen.values())


def test_chat_bench_compares_none_hash_radix():
    base = LLMEngine(tiny_model(vocab=97), None, [], EngineConfig(block_size=4, num_kv_blocks=8,
                                                                 max_num_batched_tokens=256))
    blocks = TINY_CHAT.pool_blocks(97, 4)
    need = sum(-(-n // 4) for n in TINY_CHAT.final_lengths(97))
    assert blocks < need  # the caches cannot keep everything
    engines = chat_engines(base, blocks)
    assert [e.block_manager.num_blocks for e in engines.values()] == [blocks] * 3
    assert engines["radix"].config.prefix_cache == "radix" and not engines["none"].config.enable_prefix_caching
    raw = measure_chat(engines, TINY_CHAT, 97)
    assert raw["outputs_identical"]
    per = raw["per_cache"]
    assert per["none"]["prefix_hit_tokens"] == 0 and per["none"]["computed_prompt_tokens"] >= per["none"]["prompt_tokens"]
    for name in ("hash", "radix"):
        assert per[name]["prefix_hit_tokens"] > 0 and per[name]["prefix_hit_tokens"] % 4 == 0
        assert per[name]["blocks_evicted"] > 0
        assert per[name]["computed_prompt_tokens"] < per["none"]["computed_prompt_tokens"]
    summary = json.loads(json.dumps(jsonable(summarize_chat(raw))))
    for name, f in summary["figures"].items():
        assert f["hit_rate"] == pytest.approx(per[name]["prefix_hit_tokens"] / per[name]["prompt_tokens"])
        p = f["ttft_percentiles_s"]
        assert 0 < p["p50"] <= p["p99"]
    with pytest.raises(ValueError, match="concurrency"):
        ChatWorkload(concurrency=0)


def test_prefix_chat_cli(tmp_path, capsys):
    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    out = tmp_path / "chat.json"
    argv = ["prefix", "--workload", "chat", "--model", str(folder), "--prefix-len", "20", "--conversations", "3",
            "--num-turns", "2", "--turn-len-range", "3", "6", "--answer-len", "4", "--concurrency", "2",
            "--quiet", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "prefix" and report["workload"]["num_conversations"] == 3
    assert set(report["figures"]) == {"none", "hash", "radix"} and report["outputs_identical"] is True
    assert report["settings"]["num_kv_blocks"] > 0
    assert "hit rate" in capsys.readouterr().out
