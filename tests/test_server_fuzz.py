"""Fuzz every operation of the server's OpenAPI document with schemathesis, over real HTTP.

A tiny-model server (tests/test_server_helpers.py) runs on loopback; schemathesis
reads its /openapi.json and, for each operation, Hypothesis draws a fixed number of
requests per pass from a fixed seed (derandomized, no example database), the same
requests every run:

  positive   bodies the schema accepts, as generated;
  negative   bodies (and headers, ...) the schema rejects;
  engine     positive bodies minus the knobs the server refuses with a 400 before the
             engine sees the request (penalties, logit_bias, echo, suffix, best_of, a
             random model name), so that more of them reach the engine and its own
             limits are fuzzed too.

Nothing is clamped: a huge `n`, `max_tokens`, `top_k` or `seed` the schema allows is
sent as is. Every request must:

  * get an answer that is not a 5xx (schemathesis' `not_a_server_error`: bad input
    is the client's 4xx, never an internal error or a dead engine);
  * answer within REQUEST_TIMEOUT_S seconds, the whole body included (no hang).

Failures are collected rather than raised at the first one, so one run reports them
all (but fuzzing stops if the engine dies -- every later answer would be a 503 -- or
a request hangs, which later ones might queue behind; /health is asked after every
request).
Afterwards no request is left in the engine and its KV pool is whole (every block
free again). The counts (operations, examples, failures) are printed (`-s`) and are
part of every assertion message.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
import pytest
import requests
import schemathesis  # the `test` extra; written against schemathesis 4.x (its API differs from 3.x)
from hypothesis import HealthCheck, Phase, given, seed, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup

from minillm.server import create_app
from minillm.server.background import ServerThread
from tests.test_server_helpers import MODEL_NAME, tiny_engine

EXAMPLES_PER_PASS = 30  # per operation and per pass
SEED = 20250607  # with it the same requests every run, whatever else in this file changes (derandomize alone
# seeds from the test function's source)
REQUEST_TIMEOUT_S = 20.0  # one request, connect to last byte
# refused with a 400 before the engine runs anything (minillm/server/sampling.py, completions.py, state.py)
REFUSED_UP_FRONT = ("model", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "echo",
                    "suffix", "best_of")


@dataclass
class Tally:
    operations: list[str] = field(default_factory=list)
    examples: int = 0
    per_pass: dict[str, int] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    slowest: tuple[float, str] = (0.0, "")
    stopped: str | None = None  # why fuzzing stopped early: the engine died, or a request hung

    def summary(self) -> str:
        return (f"schemathesis {schemathesis.__version__}: {len(self.operations)} operations tested, "
                f"{self.examples} examples tried, {len(self.failures)} failures; per operation and pass "
                f"{self.per_pass}; statuses {dict(sorted(self.statuses.items()))}; "
                f"slowest request {self.slowest[0]:.2f}s ({self.slowest[1]})")

    def report(self, limit: int = 8) -> str:
        shown = "\n\n".join(self.failures[:limit])
        more = f"\n\n... and {len(self.failures) - limit} more" if len(self.failures) > limit else ""
        stopped = f"\n\nFUZZING STOPPED EARLY: {self.stopped}" if self.stopped else ""
        return f"{self.summary()}{stopped}\n\n{shown}{more}"


def curl(case) -> str:
    try:
        return case.as_curl_command()
    except Exception as e:  # a case curl cannot spell: show the body instead
        return f"<no curl: {e!r}> body={case.body!r}"


def has_inputs(op) -> bool:
    """Whether the operation takes anything a negative example could break (GET /health takes nothing)."""
    return any(len(x) for x in (op.path_parameters, op.headers, op.cookies, op.query, op.body))


def without_refused_knobs(case):
    if isinstance(case.body, dict):
        case.body = {k: v for k, v in case.body.items() if k not in REFUSED_UP_FRONT}
    return case


def passes(op) -> list[tuple[str, object]]:
    out = [("positive", op.as_strategy(generation_mode=GenerationMode.POSITIVE))]
    if has_inputs(op):
        out.append(("negative", op.as_strategy(generation_mode=GenerationMode.NEGATIVE)))
    if len(op.body):
        out.append(("engine", op.as_strategy(generation_mode=GenerationMode.POSITIVE).map(without_refused_knobs)))
    return out


def fuzz(op, name: str, strategy, base_url: str, session: requests.Session, tally: Tally) -> None:
    where = f"{op.label} [{name}]"

    @settings(max_examples=EXAMPLES_PER_PASS, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)
    @seed(SEED)
    @given(case=strategy)
    def run(case) -> None:
        if tally.stopped:
            return
        tally.examples += 1
        tally.per_pass[where] = tally.per_pass.get(where, 0) + 1
        t0 = time.monotonic()
        try:
            response = case.call(base_url=base_url, session=session, timeout=REQUEST_TIMEOUT_S)
        except (requests.exceptions.Timeout, TimeoutError) as e:
            tally.failures.append(f"{where}: no answer within {REQUEST_TIMEOUT_S:.0f}s ({type(e).__name__})\n"
                                  f"    {curl(case)}")
            tally.stopped = f"a request hung (later ones would queue behind it): {curl(case)}"
            return
        except requests.exceptions.RequestException as e:
            tally.failures.append(f"{where}: the request failed: {e!r}\n    {curl(case)}")
            return
        elapsed = time.monotonic() - t0
        tally.statuses[response.status_code] = tally.statuses.get(response.status_code, 0) + 1
        if elapsed > tally.slowest[0]:
            tally.slowest = (elapsed, f"{where}: {response.status_code} {curl(case)[:400]}")
        if elapsed >= REQUEST_TIMEOUT_S:  # a stream that went silent or trickled on is cut there, not raised
            tally.failures.append(f"{where}: answered after {elapsed:.1f}s > {REQUEST_TIMEOUT_S:.0f}s\n"
                                  f"    {curl(case)}")
        try:
            case.validate_response(response, checks=[not_a_server_error])
        except FailureGroup as e:
            tally.failures.append(f"{where}: {e.exceptions[0].title}: {response.status_code} "
                                  f"{response.text[:300]}\n    {curl(case)}")
        if response.headers.get("content-type", [""])[0].startswith("text/event-stream"):
            # a stream has sent its 200 before it runs: a failure after that is an error event in it
            errors = [line for line in response.text.splitlines() if line.startswith('data: {"error"')]
            if errors:
                tally.failures.append(f"{where}: an error event in a 200 stream: {errors[0][:300]}\n    {curl(case)}")
        # the engine must survive every request, however it was answered
        health = session.get(base_url + "/health", timeout=REQUEST_TIMEOUT_S)
        if health.status_code != 200:
            tally.stopped = f"the engine died after {curl(case)}\n    /health: {health.status_code} {health.text[:300]}"

    run()


@pytest.fixture
def hypothesis_dir_outside_repo(tmp_path):
    """database=None keeps examples out of the checkout; this keeps Hypothesis' other files (its cache of
    the code's constants) out too."""
    from hypothesis import configuration

    before = configuration.storage_directory(intent_to_write=False).home_directory
    configuration.set_hypothesis_home_dir(tmp_path / "hypothesis")
    yield
    configuration.set_hypothesis_home_dir(before)


def wait_idle(ae, engine, timeout: float = 30.0) -> None:
    """Aborts and finishes are commands to the engine thread: give it a moment to apply them."""
    deadline = time.monotonic() + timeout
    while (ae.num_unfinished or engine.has_unfinished_requests()) and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.slow  # ~35 s: 5 operations x 30 examples per pass
@pytest.mark.usefixtures("hypothesis_dir_outside_repo")
def test_openapi_fuzz_no_5xx_no_hang_pool_whole():
    engine = tiny_engine()
    app = create_app(engine, model_name=MODEL_NAME)
    ae = app.state.server.engine
    tally = Tally()
    t0 = time.monotonic()
    with ServerThread(app) as srv:
        # an explicit config: no schemathesis.toml is looked for; streams are read to their end (schemathesis
        # stops after 20 events by default), so "answered in time" covers the whole stream; reproducers show
        # every value (its sanitizer would print "max_tokens": "[Filtered]": the key holds "token")
        config = schemathesis.Config.from_dict({"max-stream-events": 100_000, "request-timeout": REQUEST_TIMEOUT_S,
                                                "output": {"sanitization": {"enabled": False}}})
        schema = schemathesis.openapi.from_url(srv.url + "/openapi.json", config=config, timeout=REQUEST_TIMEOUT_S)
        ops = [result.ok() for result in schema.get_all_operations()]
        assert {op.label for op in ops} >= {"POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models",
                                            "GET /health", "GET /metrics"}, [op.label for op in ops]
        with requests.Session() as session:
            for op in ops:
                if tally.stopped:
                    break
                tally.operations.append(op.label)
                for name, strategy in passes(op):
                    fuzz(op, name, strategy, srv.url, session, tally)
        wait_idle(ae, engine)
        health = httpx.get(srv.url + "/health", timeout=REQUEST_TIMEOUT_S)
        unfinished = ae.num_unfinished
    print(f"\n{tally.summary()}; {time.monotonic() - t0:.1f}s in all")

    failed = bool(tally.stopped or tally.failures)
    assert not failed, tally.report()
    assert tally.examples >= 3 * len(ops), tally.report()  # every operation was sent something
    assert health.status_code == 200, f"/health {health.status_code} {health.text}\n{tally.summary()}"
    # nothing leaked: no request left, the pool whole
    assert unfinished == 0 and not engine.has_unfinished_requests() and not engine.requests, tally.summary()
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks, f"{bm.num_free_blocks}/{bm.num_blocks} blocks free\n{tally.summary()}"
