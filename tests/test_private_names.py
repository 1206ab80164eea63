"""No module of minillm reaches into another module's private names.

A name with one leading underscore belongs to its module: another module that needs it asks for a public
name (with a docstring) instead. The check is a plain AST walk over minillm/, kernels/ and visualize/
(minillm.kernels and minillm.visualize): `from minillm.x import _name`, and `alias._name` where `alias` is
a module bound by `import minillm.x as alias` or `from minillm import x`. Dunder names are fine. What it
cannot see: `obj._name` on an instance of another module's class (the type is not known here).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"minillm": ROOT / "minillm", "minillm.kernels": ROOT / "kernels", "minillm.visualize": ROOT / "visualize"}


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def module_file(module: str) -> Path | None:
    """The source file (or package __init__) of a minillm module, or None where there is none."""
    for prefix, folder in sorted(PACKAGES.items(), key=lambda kv: -len(kv[0])):
        if module == prefix or module.startswith(prefix + "."):
            rest = module[len(prefix):].lstrip(".").split(".") if module != prefix else []
            base = folder.joinpath(*rest)
            for candidate in (base.with_suffix(".py") if rest else None, base / "__init__.py"):
                if candidate is not None and candidate.is_file():
                    return candidate
            return None
    return None


def module_name(path: Path) -> str:
    for prefix, folder in sorted(PACKAGES.items(), key=lambda kv: -len(kv[0])):
        if folder in path.parents:
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join([prefix, *parts])
    raise ValueError(path)


def private_reaches(text: str, me: str) -> list[str]:
    """'line: what' for every private name of another minillm module that this source uses."""
    tree = ast.parse(text)
    modules: dict[str, str] = {}  # local name -> the minillm module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("minillm"):
            for alias in node.names:
                if private(alias.name) and node.module != me:
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                if module_file(f"{node.module}.{alias.name}") is not None:
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("minillm"):
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else local
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and private(node.attr)):
            continue
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if not (isinstance(value, ast.Name) and value.id in modules):
            continue
        target = ".".join([modules[value.id], *reversed(chain)])
        if module_file(target) is not None and target != me:
            found.append(f"{node.lineno}: {ast.unparse(node)} (a private name of {target})")
    return found


def source_files() -> list[Path]:
    return sorted(p for folder in PACKAGES.values() for p in folder.rglob("*.py"))


def test_no_module_uses_another_modules_private_names():
    offenders = {}
    for path in source_files():
        if found := private_reaches(path.read_text(), module_name(path)):
            offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, f"give these a public name (and a docstring) in their own module: {offenders}"


@pytest.mark.parametrize("snippet", [
    "from minillm.quant.apply import _swap\n",
    "from minillm.quant.apply import TARGETS, _swap as swap\n",
    "from minillm.kernels import paged_decode as pd\npd._decode_kernel\n",
    "from minillm.quant import apply\napply._swap(m, 'x', n)\n",
    "import minillm.quant.apply as qa\nqa._swap(m, 'x', n)\n",
    "import minillm.quant.apply\nminillm.quant.apply._swap(m, 'x', n)\n",
])
def test_the_check_finds_a_private_reach(snippet):
    assert private_reaches(snippet, "minillm.bench.cli")


def test_the_check_passes_public_and_dunder_names():
    ok = ("from minillm.quant.apply import replace_module\nfrom minillm import envs\nimport minillm.quant.apply as qa\n"
          "envs.__name__\nqa.replace_module\nself._own = 1\nfrom minillm.kernels._common import next_pow2\n")
    assert private_reaches(ok, "minillm.bench.cli") == []


def test_a_module_may_use_its_own_private_names():
    assert private_reaches("import minillm.quant.apply as me\nme._swap\n", "minillm.quant.apply") == []
