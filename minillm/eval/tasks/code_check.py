"""Run a completion against a task's unit tests: extract the body, execute in a subprocess.

The model continues a function's docstring; everything after the function's body (a new
top-level def/class, a `__main__` block, example prints, a closing code fence) is cut
off: first by the engine's stop strings (STOP, to save tokens), then here by the first
non-empty line that is not indented (the dedent that ends the body).

Execution: prompt + body + tests in a fresh `python -I` process with a wall-clock timeout,
CPU, memory and file-size limits, its own session (the whole process group is killed on
timeout) and a preamble that refuses sockets and child processes. That stops accidents
(a loop that never ends, a test that allocates without bound, a stray network call); it is
not a security boundary for hostile code -- run untrusted models in a container.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from minillm.eval.tasks.code_data import CodeTask

# engine stop strings: where a function body has certainly ended
STOP = ["\ndef ", "\nclass ", "\nif __name__", "\n#", "\nprint(", "\nassert ", "\n```", '\n"""']
TIMEOUT_S = 5.0
MEMORY_BYTES = 1 << 30

# runs first in the child: no sockets, no subprocesses, resource limits (Linux/macOS)
_PREAMBLE = f'''
import socket as _s, os as _os, subprocess as _sp
def _refuse(*a, **k):
    raise PermissionError("minillm eval tasks: network and subprocesses are disabled")
_s.socket = _s.create_connection = _refuse
_sp.Popen = _os.system = _os.fork = _refuse
try:
    import resource as _r
    _r.setrlimit(_r.RLIMIT_AS, ({MEMORY_BYTES}, {MEMORY_BYTES}))
    _r.setrlimit(_r.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    _r.setrlimit(_r.RLIMIT_CPU, (_CPU_S, _CPU_S))
except (ImportError, ValueError, OSError):
    pass
del _refuse, _s, _os, _sp, _CPU_S
'''


@dataclass(frozen=True)
class CheckResult:
    task_id: str
    passed: bool
    status: str  # "passed", "failed" (an assertion or exception), "timeout", "syntax_error"
    detail: str = ""  # the last line of the error, or why it timed out


def extract_body(completion: str) -> str:
    """The function body: the completion up to the first non-empty, non-indented line."""
    lines = completion.split("\n")
    kept = []
    for line in lines:
        if line.strip() and not line[:1].isspace():
            break
        kept.append(line)
    return "\n".join(kept).rstrip() + "\n"


def build_program(task: CodeTask, body: str) -> str:
    return f"{task.prompt}{body}\n\n{task.tests}"


def run_program(program: str, task_id: str = "", timeout_s: float = TIMEOUT_S) -> CheckResult:
    """Execute `program` after the preamble; passed when it runs to its end within the timeout.

    "To its end": a nonce printed after the last line must appear, so a body that exits early
    with status 0 (sys.exit(0), os._exit(0)) before the asserts ran does not pass.
    """
    try:
        compile(program, f"<{task_id}>", "exec")
    except SyntaxError as e:  # ValueError (a NUL byte) too: the model wrote something unrunnable
        return CheckResult(task_id, False, "syntax_error", f"{type(e).__name__}: {e.msg} (line {e.lineno})")
    except ValueError as e:
        return CheckResult(task_id, False, "syntax_error", f"{type(e).__name__}: {e}")
    nonce = secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="minillm-task-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            # CPU seconds: past the wall-clock timeout, so a busy machine times out before SIGXCPU
            f.write(f"_CPU_S = {max(1, int(timeout_s) + 1)}\n" + _PREAMBLE + "\n" + program
                    + f"\nprint({nonce!r}, flush=True)\n")
        # output to files, not pipes: the file-size limit caps a program that prints without end
        with open(os.path.join(tmp, "out"), "wb") as out, open(os.path.join(tmp, "err"), "wb") as errf:
            proc = subprocess.Popen(
                [sys.executable, "-I", path], cwd=tmp, stdin=subprocess.DEVNULL, stdout=out, stderr=errf,
                start_new_session=True, env={"PATH": os.environ.get("PATH", "")},
            )
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill(proc)
                return CheckResult(task_id, False, "timeout", f"killed after {timeout_s:g} s")
        with open(os.path.join(tmp, "out"), "rb") as f:
            stdout = f.read().decode("utf-8", "replace")
        with open(os.path.join(tmp, "err"), "rb") as f:
            err = f.read().decode("utf-8", "replace")
    if proc.returncode == 0 and nonce in stdout.splitlines()[-1:]:
        return CheckResult(task_id, True, "passed")
    if proc.returncode == 0:
        return CheckResult(task_id, False, "failed", "exited before the tests finished")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit code {proc.returncode}"
    if proc.returncode < 0:  # killed by a signal: the CPU limit (SIGXCPU) or memory
        last = f"signal {-proc.returncode} ({last})"
    return CheckResult(task_id, False, "failed", last[:300])


def _kill(proc: subprocess.Popen) -> None:
    """Kill the program and anything it started (its own session, so its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()
    proc.wait()


def check_completion(task: CodeTask, completion: str, timeout_s: float = TIMEOUT_S) -> CheckResult:
    """pass/fail of a model's completion of `task.prompt`."""
    return run_program(build_program(task, extract_body(completion)), task.task_id, timeout_s)


def check_all(tasks: list[CodeTask], completions: list[str], timeout_s: float = TIMEOUT_S,
              workers: int = 4) -> list[CheckResult]:
    """check_completion for every (task, completion) pair, a few subprocesses at a time, in order."""
    if len(tasks) != len(completions):
        raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda tc: check_completion(tc[0], tc[1], timeout_s), zip(tasks, completions)))
