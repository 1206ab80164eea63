"""No import cycles among minillm's modules, imports inside functions and under TYPE_CHECKING included.

Layers, bottom up: minillm.envs and minillm.config; attention/, models/; engine/ (the core); the optional
parts (cpu/, quant/, spec_decode/, parallel/); the lab (bench/, roofline/, eval/, metrics/, server/, cli.py).
A module imports its own layer and those below. Where the core needs an optional part for an optional
feature it imports it inside the function that needs it, and that part then imports nothing that leads
back: it is given what it needs (an argument, a callable) or imports lower modules only.

The check is a plain AST walk over minillm/, kernels/ and visualize/ (installed as minillm.kernels and
minillm.visualize): every `import` and `from ... import` anywhere in a file is an edge to the module it
names (a submodule where `from package import name` names one). A module importing its own package's
__init__ is no edge. Any strongly connected component of more than one module is a cycle.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"minillm": ROOT / "minillm", "minillm.kernels": ROOT / "kernels", "minillm.visualize": ROOT / "visualize"}


def import_graph(packages: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the project's modules it imports}, for every .py file under each package folder."""
    files: dict[str, Path] = {}
    for prefix, folder in packages.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join([prefix, *parts])] = path

    def resolve(name: str) -> str | None:  # the longest prefix that is one of our modules
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in files}
    for me, path in files.items():
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + [node.module] if node.module else base)
                names = [module] + [f"{module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name)
                if target and target != me and not me.startswith(target + "."):
                    edges[me].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found, key=len, reverse=True)


def describe(found: list[list[str]], edges: dict[str, set[str]]) -> str:
    lines = []
    for component in found:
        members = set(component)
        lines.append(f"cycle of {len(component)}:")
        lines += [f"  {m} -> {t}" for m in component for t in sorted(edges[m] & members)]
    return "\n".join(lines)


def test_the_project_has_no_import_cycles():
    edges = import_graph(PACKAGES)
    assert len(edges) > 100 and "minillm.engine.llm_engine" in edges and "minillm.kernels.paged_decode" in edges
    found = cycles(edges)
    assert not found, f"{len(found)} import cycle(s); break each by structure, not by hiding an import:\n" \
                      + describe(found, edges)


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    write(tmp_path / "pkg", {
        "__init__.py": "from pkg.low import base\n",  # a package's __init__ imported by its own modules: no cycle
        "low.py": "import pkg\n\ndef base():\n    return 1\n",
        "config.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.plugin import Plugin\n",
        "core.py": "from pkg.low import base\n\ndef run():\n    from pkg.sub import plugin\n    return plugin.go()\n",
        "sub/__init__.py": "",
        "sub/plugin.py": "from .. import core\nfrom . import helper\n\nclass Plugin:\n    pass\n",
        "sub/helper.py": "from ..low import base\n",
    })
    edges = import_graph({"pkg": tmp_path / "pkg"})
    assert edges["pkg.sub.plugin"] == {"pkg.core", "pkg.sub.helper"}  # relative imports, `from package import module`
    assert edges["pkg.sub.helper"] == {"pkg.low"} and edges["pkg.low"] == set()
    assert cycles(edges) == [["pkg.core", "pkg.sub.plugin"]]
    assert "pkg.core -> pkg.sub.plugin" in describe(cycles(edges), edges)

    (tmp_path / "pkg" / "sub" / "plugin.py").write_text("from . import helper\n\nclass Plugin:\n    pass\n")
    assert cycles(import_graph({"pkg": tmp_path / "pkg"})) == []


def test_an_import_under_type_checking_counts(tmp_path):
    write(tmp_path / "pkg", {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "b.py": "import pkg.a\n",
    })
    assert cycles(import_graph({"pkg": tmp_path / "pkg"})) == [["pkg.a", "pkg.b"]]
