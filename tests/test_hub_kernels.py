"""A checkout's kernels/ folder must not shadow Hugging Face's `kernels` package (minillm/hub_kernels.py).

transformers 5.x imports `kernels`; with the checkout root first on sys.path (pytest, `python -m
minillm` from the root) it used to get minillm's folder and fail on a missing name.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _import_kernels_from_root(with_minillm: bool) -> str:
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            + ("import minillm\n" if with_minillm else "")
            + "import kernels; print(kernels.__file__)")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_import_kernels_finds_the_installed_package_not_the_checkout_folder():
    installed = [p for p in sys.path if p and Path(p).resolve() != ROOT]
    if importlib.machinery.PathFinder.find_spec("kernels", installed) is None:
        pytest.skip("Hugging Face's kernels package is not installed (transformers < 5 does not need it)")
    assert Path(_import_kernels_from_root(with_minillm=False)).parent == ROOT / "kernels"  # the shadowing is real
    got = Path(_import_kernels_from_root(with_minillm=True))
    assert got.parent != ROOT / "kernels" and "site-packages" in str(got)


def test_minillm_kernels_is_still_the_checkout_folder():
    import minillm.kernels

    assert Path(minillm.kernels.__file__).resolve().parent == ROOT / "kernels"
