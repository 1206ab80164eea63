"""Keep Hugging Face's `kernels` package importable from a source checkout.

transformers (5.x) depends on, and imports, the Hub's `kernels` package. A checkout of
minillm has its own top-level kernels/ folder (installed as minillm.kernels, never imported
as `kernels`), and whenever the checkout root is on sys.path -- pytest, `python -m minillm`
started from the root, a notebook that adds the root -- `import kernels` would find that
folder first, and transformers fails with "cannot import name 'CUDAProperties' from 'kernels'".

The finder below answers only for the top-level name `kernels`: it looks on sys.path without
the checkout root and returns the installed package's spec, or nothing (then the usual
search runs). Nothing is imported until someone imports `kernels`.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path

CHECKOUT_ROOT = Path(__file__).resolve().parent.parent


def _is_checkout_root(entry: str) -> bool:
    try:
        return Path(entry or os.getcwd()).resolve() == CHECKOUT_ROOT
    except OSError:
        return False


class InstalledKernelsFirst(importlib.abc.MetaPathFinder):
    """`import kernels` finds the installed package before the checkout's kernels/ folder."""

    def find_spec(self, name, path=None, target=None):
        if name != "kernels" or path is not None:
            return None
        others = [p for p in sys.path if not _is_checkout_root(p)]
        return importlib.machinery.PathFinder.find_spec(name, others)


def install() -> None:
    if not any(isinstance(f, InstalledKernelsFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, InstalledKernelsFirst())
