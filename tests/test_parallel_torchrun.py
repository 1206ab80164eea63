"""Tensor / pipeline parallelism over ranks torchrun started: two or three "nodes" on this machine.

Each node is its own `python -m torch.distributed.run --nnodes N --node-rank i` agent (static
rendezvous on 127.0.0.1), running `python -m minillm generate ...` on a tiny random 3-layer Llama
saved to a temp folder. Rank 0 prints the greedy token ids; they must equal one process's
LLM(...). Then a rank is SIGKILLed mid-generation and every surviving rank must exit with its
own one-line error within KILL_TIMEOUT_S.
"""
from __future__ import annotations

import time

import pytest

from minillm import LLM, SamplingParams
from minillm.parallel.torchrun import TorchrunEnv, check_world_size, torchrun_env
from tests.helpers.tiny_models import make_tiny_hf_model
from tests.helpers.torchrun_launch import TorchrunNodes

PROMPT, MAX_TOKENS = "The tiny model says", 12
# what `generate` passes besides the model: a small KV pool (the default 512 MiB per rank only costs time)
COMMON = ["--temperature", "0", "--ignore-eos", "--kv-cache-mb", "16"]
START_TIMEOUT_S = 150  # agents + ranks importing torch and loading on 2 shared cores (measured 14-20 s quiet)
KILL_TIMEOUT_S = 30  # from the kill to every torchrun agent gone (measured 0.6-2.4 s)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> str:
    # 3 layers: pp=3 has a middle stage; 8 / 4 heads: tp=2; 2048 positions: a long run to kill mid-way
    folder, _ = make_tiny_hf_model(tmp_path_factory.mktemp("torchrun"), "llama", num_attention_heads=8,
                                   num_key_value_heads=4, num_hidden_layers=3, max_position_embeddings=2048)
    return str(folder)


@pytest.fixture(scope="module")
def one_process_tokens(tiny_folder) -> list[int]:
    llm = LLM(tiny_folder, kv_cache_memory_bytes=16 * 2**20)
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
    return list(out[0].outputs[0].token_ids)


def printed_token_ids(log: str) -> list[int]:
    lines = [line for line in log.splitlines() if line.startswith("token_ids:")]
    assert len(lines) == 1, log[-3000:]
    return [int(t) for t in lines[0].split()[1:]]


@pytest.mark.slow
@pytest.mark.parametrize("split", ["--tensor-parallel-size", "--pipeline-parallel-size"], ids=["tp2", "pp2"])
def test_two_nodes_give_the_one_process_greedy_tokens(split, tiny_folder, one_process_tokens, tmp_path):
    args = ["generate", PROMPT, "--model", tiny_folder, "--max-tokens", str(MAX_TOKENS), "--print-token-ids",
            split, "2", *COMMON]
    with TorchrunNodes([1, 1], args, tmp_path) as nodes:
        codes = nodes.wait(START_TIMEOUT_S)
        assert codes == [0, 0], nodes.log(0)[-3000:] + nodes.log(1)[-3000:]
        assert printed_token_ids(nodes.log(0)) == one_process_tokens
        assert "token_ids:" not in nodes.log(1)  # only rank 0 runs the command
        assert "minillm rank" not in nodes.log(1)  # rank 1 left its loop on rank 0's shutdown, no error


@pytest.mark.slow
@pytest.mark.parametrize("nodes_split_victim", [
    (2, "--tensor-parallel-size", 0),  # the front end dies: the worker must notice
    (3, "--pipeline-parallel-size", 1),  # a middle stage dies: rank 0 and the last stage must notice
], ids=["tp2-kill-rank0", "pp3-kill-rank1"])
def test_a_killed_rank_stops_every_surviving_rank_with_a_clear_error(nodes_split_victim, tiny_folder, tmp_path):
    n, split, victim = nodes_split_victim
    args = ["generate", PROMPT, "--model", tiny_folder, "--max-tokens", "1900", split, str(n), *COMMON]
    with TorchrunNodes([1] * n, args, tmp_path) as nodes:  # one rank per node: its agent kills nothing else
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(nodes.log(0)) < len(PROMPT) // 2:  # rank 0 streams text: the run is under way
            assert time.monotonic() < deadline and nodes.agents[0].poll() is None, nodes.log(0)[-3000:]
            time.sleep(0.05)
        ranks = nodes.ranks()
        assert sorted(ranks) == list(range(n))
        ranks[victim].kill()
        t0 = time.monotonic()
        codes = nodes.wait(KILL_TIMEOUT_S)
        elapsed = time.monotonic() - t0
        assert all(code != 0 for code in codes), codes
        assert elapsed < KILL_TIMEOUT_S
        for rank in set(range(n)) - {victim}:
            log = nodes.log(rank)  # node i runs rank i
            if rank == 0:
                assert "minillm rank 0/" in log and "closed its connection: the process died" in log, log[-3000:]
            else:
                assert f"minillm rank {rank}/{n}: serving rank 0's steps failed" in log, log[-3000:]
            assert "did not answer within" not in log  # a death is seen at once, not as a timeout


def test_torchrun_env_is_read_only_from_a_multi_process_launch():
    base = dict(RANK="2", WORLD_SIZE="3", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                MASTER_PORT="29500")
    assert torchrun_env(base) == TorchrunEnv(rank=2, world_size=3, local_rank=0, local_world_size=1)
    assert torchrun_env({**base, "WORLD_SIZE": "1"}) is None  # one process: local workers as before
    assert torchrun_env({k: v for k, v in base.items() if k != "MASTER_ADDR"}) is None
    assert torchrun_env({}) is None


def test_world_size_must_equal_the_split():
    env = TorchrunEnv(rank=0, world_size=2, local_rank=0, local_world_size=1)
    check_world_size(env, 2, 1)
    check_world_size(env, 1, 2)
    with pytest.raises(ValueError, match=r"torchrun started 2 processes .* = 3"):
        check_world_size(env, 3, 1)
