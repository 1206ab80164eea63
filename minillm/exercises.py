"""Which code the engine runs at the five exercise seams: the engine's own, the learner's, or the solutions'.

The course's exercises (exercises/ at the top of the checkout) each implement one function the
engine really calls, by its module name:

    exercise        engine seam (module.name)
    block_hash      minillm.engine.block_manager.chain_block_hash, .cached_prefix_blocks
    admission       minillm.engine.scheduler.admit_within_budget
    sampling        minillm.engine.sampler.top_p_min_p_filter
    online_softmax  minillm.attention.tiled_backend.online_softmax_update  (attention_backend="tiled")
    rejection       minillm.spec_decode.rejection.accept_or_resample

`use("learner")` rebinds those names to the functions in exercises/exNN_*.py, `use("solutions")`
to exercises/solutions/, `use("reference")` back to the engine's own; `only=` picks exercises.
Nothing else changes, so the default path costs nothing. It works as a call (lasting) or as a
context manager (restored on exit). The environment variable MINILLM_EXERCISES=learner (or
learner:block_hash,sampling) does the same when minillm is imported.

    from minillm import LLM, exercises
    exercises.use("learner", only=["sampling"])
    llm = LLM()          # samples with exercises/ex03_sampling.py, also live under Dashboard(llm)
    exercises.use("reference")

A block manager reads `chain_block_hash` when it is built (one pool, one digest function): build
the LLM inside the switch. The other seams are read at every call.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterable

from minillm import envs

CHOICES = ("reference", "learner", "solutions")

# exercise -> (file under exercises/, [(engine module, function name), ...])
SEAMS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "block_hash": ("ex01_block_hash", [("minillm.engine.block_manager", "chain_block_hash"),
                                       ("minillm.engine.block_manager", "cached_prefix_blocks")]),
    "admission": ("ex02_admission", [("minillm.engine.scheduler", "admit_within_budget")]),
    "sampling": ("ex03_sampling", [("minillm.engine.sampler", "top_p_min_p_filter")]),
    "online_softmax": ("ex04_online_softmax", [("minillm.attention.tiled_backend", "online_softmax_update")]),
    "rejection": ("ex05_rejection", [("minillm.spec_decode.rejection", "accept_or_resample")]),
}
EXERCISES = tuple(SEAMS)

_REFERENCE: dict[tuple[str, str], Callable] = {}  # the engine's own functions, saved before any rebinding
_current: dict[str, str] = {name: "reference" for name in SEAMS}


def _engine_module(name: str) -> ModuleType:
    module = importlib.import_module(name)
    for attr in [a for m, a in _all_seams() if m == name]:
        _REFERENCE.setdefault((name, attr), getattr(module, attr))
    return module


def _all_seams() -> list[tuple[str, str]]:
    return [seam for _, seams in SEAMS.values() for seam in seams]


def _exercises_package() -> None:
    """Make the top-level `exercises` package importable (it sits next to minillm/ in a checkout)."""
    try:
        importlib.import_module("exercises")
    except ModuleNotFoundError:
        root = Path(__file__).resolve().parent.parent
        if not (root / "exercises" / "__init__.py").is_file():
            raise ModuleNotFoundError("the exercises/ folder is not next to minillm/ (a source checkout has it)")
        sys.path.insert(0, str(root))


def implementation(exercise: str, choice: str) -> dict[str, Callable]:
    """{function name: function} of one exercise as `choice` implements it."""
    if exercise not in SEAMS:
        raise ValueError(f"unknown exercise {exercise!r}; choose from {EXERCISES}")
    if choice not in CHOICES:
        raise ValueError(f"unknown implementation {choice!r}; choose from {CHOICES}")
    filename, seams = SEAMS[exercise]
    if choice == "reference":
        for mod, _ in seams:
            _engine_module(mod)  # saves the engine's own functions on first import
        return {attr: _REFERENCE[(mod, attr)] for mod, attr in seams}
    _exercises_package()
    package = "exercises" if choice == "learner" else "exercises.solutions"
    module = importlib.import_module(f"{package}.{filename}")
    return {attr: getattr(module, attr) for _, attr in seams}


def check(exercise: str, choice: str = "learner") -> None:
    """Run exercises/checks.py on `choice`'s implementation: returns, or raises what is wrong."""
    _exercises_package()
    from exercises.checks import run_check

    run_check(exercise, implementation(exercise, choice))


def current() -> dict[str, str]:
    """Which implementation each exercise's seam runs now."""
    return dict(_current)


class use:
    """Rebind the seams of `only` (default: all five exercises) to `choice`'s functions.

    As a call the change lasts; as a context manager the previous bindings come back on exit.
    """

    def __init__(self, choice: str = "learner", only: Iterable[str] | None = None) -> None:
        names = list(EXERCISES if only is None else ([only] if isinstance(only, str) else only))
        impls = {name: implementation(name, choice) for name in names}  # import everything before rebinding
        self._saved = {name: _current[name] for name in names}
        self._previous = {seam: getattr(_engine_module(seam[0]), seam[1]) for name in names for seam in SEAMS[name][1]}
        for name in names:
            for mod, attr in SEAMS[name][1]:
                setattr(_engine_module(mod), attr, impls[name][attr])
            _current[name] = choice

    def __enter__(self) -> "use":
        return self

    def __exit__(self, *exc) -> None:
        for (mod, attr), fn in self._previous.items():
            setattr(_engine_module(mod), attr, fn)
        _current.update(self._saved)


def parse_env(value: str) -> tuple[str, list[str] | None]:
    """"learner" -> ("learner", None); "learner:block_hash,sampling" -> ("learner", [...])."""
    choice, _, names = value.strip().partition(":")
    return choice, ([n.strip() for n in names.split(",") if n.strip()] or None)


def use_from_env() -> None:
    """Apply MINILLM_EXERCISES, if set (minillm/__init__.py calls this)."""
    value = envs.exercises()
    if value:
        choice, only = parse_env(value)
        use(choice, only)
