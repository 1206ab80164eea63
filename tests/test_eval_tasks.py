"""`minillm eval tasks`: the code checker, the task sets' integrity, exact match, one small real run."""
from __future__ import annotations

import json
import os
import time

import pytest

from minillm.eval.tasks import CODE_TASKS, check_all, check_completion, extract_body
from minillm.eval.tasks.code_check import run_program
from minillm.eval.tasks.facts_check import is_match, messages, normalize
from minillm.eval.tasks.facts_data import FACT_ITEMS, FactItem
from minillm.eval.tasks.run import ItemResult, TaskRow, compare_with_float, suite_items

TASK = next(t for t in CODE_TASKS if t.task_id == "str/count_vowels")


# ---- the checker -----------------------------------------------------------------------------

def test_checker_passes_a_right_body_and_fails_a_wrong_one():
    assert check_completion(TASK, TASK.reference).status == "passed"
    bad = check_completion(TASK, "    return len(text)\n")
    assert (bad.passed, bad.status) == (False, "failed") and "AssertionError" in bad.detail
    raised = check_completion(TASK, "    return undefined_name\n")
    assert raised.status == "failed" and "NameError" in raised.detail


@pytest.mark.parametrize("exit_call", ["import sys; sys.exit(0)", "import os; os._exit(0)"])
def test_a_body_that_exits_early_with_status_0_fails(exit_call):
    r = check_completion(TASK, f"    {exit_call}\n")
    assert (r.passed, r.status, r.detail) == (False, "failed", "exited before the tests finished")


def test_endless_output_is_capped_not_buffered():
    r = run_program("while True:\n    print('x' * 1000)\n", "spam", timeout_s=3.0)
    assert not r.passed and r.status in ("failed", "timeout")  # SIGXFSZ at the 1 MiB file limit


def test_checker_reports_syntax_errors_without_running():
    r = check_completion(TASK, "    return (1 +\n")
    assert (r.passed, r.status) == (False, "syntax_error") and "SyntaxError" in r.detail


def test_an_infinite_loop_is_killed_at_the_timeout(tmp_path):
    pid_file = tmp_path / "pid"
    program = f"import os\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nwhile True:\n    pass\n"
    t0 = time.perf_counter()
    r = run_program(program, "loop", timeout_s=1.0)
    assert r.status == "timeout" and not r.passed
    assert time.perf_counter() - t0 < 4.0
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left spinning
        os.kill(pid, 0)


def test_network_subprocesses_and_huge_allocations_are_refused():
    net = run_program("import socket\nsocket.create_connection(('127.0.0.1', 9))\n", "net")
    assert net.status == "failed" and "PermissionError" in net.detail
    sub = run_program("import subprocess\nsubprocess.run(['true'])\n", "sub")
    assert sub.status == "failed" and "PermissionError" in sub.detail
    mem = run_program("x = bytearray(4 << 30)\n", "mem")  # 4 GiB: over the 1 GiB address-space limit
    assert mem.status == "failed" and "MemoryError" in mem.detail


def test_the_body_ends_at_the_first_unindented_line():
    completion = TASK.reference + "\n\nprint(count_vowels('abc'))\ndef other():\n    return 1\n"
    assert extract_body(completion) == TASK.reference
    nested = "    def inner(c):\n        return c in 'aeiou'\n\n    return sum(map(inner, text.lower()))\nx = 1\n"
    assert extract_body(nested).endswith("text.lower()))\n") and "x = 1" not in extract_body(nested)
    # trailing junk cut off, the body alone passes
    assert check_completion(TASK, completion).passed


# ---- the task sets -------------------------------------------------------------------------

def test_code_tasks_are_many_varied_and_unique():
    ids = [t.task_id for t in CODE_TASKS]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)
    assert len({i.split("/")[0] for i in ids}) >= 5  # strings, lists, dicts, math, parsing, recursion, grids
    for t in CODE_TASKS:
        assert t.prompt.startswith(("def ", "import ", "from ")) and f"def {t.entry_point}(" in t.prompt
        assert t.prompt.rstrip().endswith('"""') and t.tests.count("assert ") >= 3, t.task_id


def test_every_reference_passes_its_tests():
    results = check_all(CODE_TASKS, [t.reference for t in CODE_TASKS])
    assert [r.task_id for r in results if not r.passed] == []


@pytest.mark.parametrize("body", ["    return None\n", "    pass\n", "    raise NotImplementedError\n"])
def test_every_task_fails_a_wrong_body(body):
    results = check_all(CODE_TASKS, [body] * len(CODE_TASKS))
    assert [r.task_id for r in results if r.passed] == []


def test_fact_items_are_enough_and_unique():
    ids = [i.item_id for i in FACT_ITEMS]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)
    assert {i.kind for i in FACT_ITEMS} == {"text", "case", "json"}
    for i in FACT_ITEMS:  # every item's own answers match, so a right reply can score
        assert all(is_match(i, a) for a in i.answers), i.item_id
    conv = messages(FACT_ITEMS[0])
    assert conv[0]["role"] == "system" and conv[-1] == {"role": "user", "content": FACT_ITEMS[0].question}
    with pytest.raises(ValueError, match="unknown suite"):
        suite_items("poetry")


# ---- exact match --------------------------------------------------------------------------

def test_normalization_is_what_the_docstring_states():
    assert normalize('  **"Paris."**\n') == "paris"
    assert normalize("Hello   World!") == "hello world"
    assert normalize("```\n42\n```") == "42"
    assert normalize("'APPLE'", fold_case=False) == "APPLE"
    paris = FactItem("t", "q", ("paris",))
    assert is_match(paris, "Paris") and is_match(paris, "paris.")
    assert not is_match(paris, "The capital of France is Paris.") and not is_match(paris, "Paris, France")
    upper = FactItem("u", "q", ("APPLE",), kind="case")
    assert is_match(upper, '"APPLE"') and not is_match(upper, "Apple")
    js = FactItem("j", "q", ('{"x": 3}',), kind="json")
    assert is_match(js, '```json\n{\n  "x": 3\n}\n```') and is_match(js, '{"x":3}')
    assert not is_match(js, '{"x": "3"}') and not is_match(js, "x = 3") and not is_match(js, '{"x": 3, "y": 1}')


def test_change_and_flips_are_against_the_float_row():
    def row(scheme, passes):
        r = TaskRow(scheme, "facts", passed=sum(passes), total=len(passes), score=sum(passes) / len(passes))
        r.items = [ItemResult(str(k), p, "yes" if p else "no") for k, p in enumerate(passes)]
        return r

    rows = [row("float", [True, True, False, False]), row("int4", [True, False, True, False])]
    compare_with_float(rows)
    assert rows[0].change_pts == 0 and rows[0].flips_vs_float == 0
    assert rows[1].change_pts == 0 and rows[1].flips_vs_float == 2  # same score, two items swapped
    assert rows[1].changed_vs_float == 2 and rows[0].changed_vs_float == 0
    lone = [row("int8", [True, False])]
    compare_with_float(lone)
    assert lone[0].change_pts is None


# ---- a real run ---------------------------------------------------------------------------

@pytest.mark.slow  # two loads + generations of the default model: ~20 s on a quiet 2-core machine, more when busy
@pytest.mark.default_model
@pytest.mark.usefixtures("one_thread")
def test_eval_tasks_cli_on_three_fact_items(tmp_path, capsys):
    from minillm.eval.cli import main

    out = tmp_path / "tasks.json"
    # float twice: greedy decoding of the same batch must give the same outputs (a stable score)
    assert main(["tasks", "--suite", "facts", "--limit", "3", "--quantization", "float,float", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    r, again = report["rows"]
    assert r["scheme"] == "float" and r["total"] == 3 and [i["item_id"] for i in r["items"]] == \
        ["capital/france", "capital/japan", "capital/germany"]
    for it, item in zip(r["items"], FACT_ITEMS):  # the verdicts are the outputs re-judged
        assert it["passed"] == is_match(item, it["output"])
    assert r["passed"] == sum(i["passed"] for i in r["items"]) and r["change_pts"] == 0
    # measured with greedy decoding: the float model answers "Paris", "Tokyo", "Berlin"
    assert r["passed"] == 3, r["items"]
    assert [i["output"] for i in again["items"]] == [i["output"] for i in r["items"]] and again["changed_vs_float"] == 0
    assert "float" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown part"):
        main(["tasks", "--quantization", "int5"])
