"""Optional extras: a command checks at its start that what it will import is installed.

Without this a missing extra fails late and raw: `minillm serve` loaded the
model and then died on `ModuleNotFoundError: fastapi`; `minillm demo --html`
ran the whole demo and then crashed on plotly. `require` fails first, and
says which extra (pyproject.toml's optional-dependencies) to install.
"""
from __future__ import annotations

import importlib.util
from typing import Sequence

# module name -> its pip name, where they differ
PIP_NAMES = {"prometheus_client": "prometheus-client", "llama_cpp": "llama-cpp-python"}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-installed package
        return False


def missing_message(command: str, extra: str, missing: Sequence[str]) -> str:
    pips = " ".join(PIP_NAMES.get(m, m) for m in missing)
    return (f"{command} needs the '{extra}' extra (missing: {', '.join(missing)}): "
            f"pip install -e \".[{extra}]\" in the minillm checkout (or: pip install {pips})")


def require(command: str, extra: str, modules: Sequence[str]) -> None:
    """Exit with a message naming `extra` when any of `modules` is not installed."""
    missing = [m for m in modules if not installed(m)]
    if missing:
        raise SystemExit(missing_message(command, extra, missing))


SERVER_MODULES = ("fastapi", "uvicorn", "prometheus_client")
HTML_REPORT_MODULES = ("plotly",)
