"""Bad input gets a clear error naming the problem, and the engine keeps serving everyone else."""
import pytest

from minillm import RequestError, SamplingParams
from tests.helpers.engine_utils import dense_greedy, greedy, make_engine, run_to_completion, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model(max_pos=64)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-3), "top_k"),
        (dict(min_p=2.0), "min_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(n=0), "n must"),
        (dict(logprobs=100), "logprobs"),
        (dict(stop=[""]), "stop"),
        (dict(min_tokens=5, max_tokens=2), "min_tokens"),
    ],
)
def test_invalid_sampling_values(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        SamplingParams(**kwargs)


def test_bad_requests_rejected_others_finish(model):
    eng = make_engine(model, num_blocks=12, block_size=4, max_num_batched_tokens=32)  # 48-token pool, context 64
    good = [[1, 2, 3, 4, 5], [7, 8, 9]]
    eng.add_request("ok0", good[0], greedy(6))
    with pytest.raises(RequestError, match="empty"):
        eng.add_request("empty", [], greedy(4))
    with pytest.raises(RequestError, match="context length"):
        eng.add_request("long", list(range(70)), greedy(4))
    with pytest.raises(RequestError, match="never fit"):
        eng.add_request("huge", list(range(50)), greedy(4))
    with pytest.raises(RequestError, match="max_tokens"):
        eng.add_request("toolong", [1, 2, 3], greedy(60))
    with pytest.raises(RequestError, match="token ids"):
        eng.add_request("oov", [1, 5000], greedy(4))
    with pytest.raises(RequestError, match="already"):
        eng.add_request("ok0", [1], greedy(4))
    eng.add_request("ok1", good[1], greedy(6))
    out = run_to_completion(eng)
    assert out == {"ok0": dense_greedy(model, good[0], 6), "ok1": dense_greedy(model, good[1], 6)}
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_abort_running_request_frees_blocks(model):
    eng = make_engine(model, num_blocks=64, block_size=4)
    eng.add_request("a", list(range(1, 30)), greedy(20))
    eng.add_request("b", list(range(2, 12)), greedy(10))
    eng.step()
    eng.step()
    held = [s for s in eng.live_sequences() if s.request_id == "a"][0].block_table
    assert held
    assert eng.abort_request("a")
    assert not eng.abort_request("a")  # unknown now
    eng.block_manager.check_invariants(eng.live_sequences())
    out = run_to_completion(eng)
    assert out["b"] == dense_greedy(model, list(range(2, 12)), 10)
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    aborted = [f for t in eng.trace for f in t.finished if f.reason == "abort"]
    assert [f.request_id for f in aborted] == ["a"]
    freed = {b for t in eng.trace for b in t.blocks_freed}
    assert set(held) <= freed


def test_context_limit_finishes_with_length(model):
    eng = make_engine(model, num_blocks=64, block_size=4)
    eng.add_request("r", list(range(1, 60)), SamplingParams(temperature=0, max_tokens=None, ignore_eos=True))
    out = run_to_completion(eng)
    assert len(out["r"]) == 64 - 59
