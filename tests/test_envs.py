"""minillm/envs.py is the one place that reads MINILLM_* variables, declares every one, and the book's table
(book/environment.md) lists exactly those. What can fail: a module that reads os.environ["MINILLM_..."] (or
keeps the name in a string of its own) again, a new variable that is not declared, a table out of date
(WRITE, below, writes it again), an accessor that parses differently."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from minillm import envs

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("minillm", "kernels", "visualize")
ENVS_PY = ROOT / "minillm" / "envs.py"
WRITE = """python -c 'from minillm import envs; print(envs.markdown_chapter(), end="")' > book/environment.md"""
NAME = re.compile(r"MINILLM_[A-Z0-9_]*[A-Z0-9]")
# a read spelled out: os.environ.get("MINILLM_X"), os.environ["MINILLM_X"], os.getenv('MINILLM_X'), "MINILLM_X" in os.environ
LITERAL_READ = re.compile(r"""(environ\s*(\.\s*(get|pop|setdefault)\s*\(|\[)|getenv\s*\()\s*[rbf]?["']MINILLM_"""
                          r"""|["']MINILLM_\w+["']\s+(not\s+)?in\s+(os\.)?environ""")


def source_files() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py") if p != ENVS_PY)


def _environ_key_reads(tree: ast.AST):
    """(line, key expression) of every read of the environment: os.environ.get/pop/setdefault(key),
    os.environ[key] (not an assignment), os.getenv(key), key in os.environ."""
    def is_environ(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or (isinstance(node, ast.Name)
                                                                               and node.id == "environ")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") and is_environ(f.value):
                yield node.lineno, node.args[0]
            elif (isinstance(f, ast.Attribute) and f.attr == "getenv") or (isinstance(f, ast.Name) and f.id == "getenv"):
                yield node.lineno, node.args[0]
        elif isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
            yield node.lineno, node.slice
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and any(is_environ(c) for c in node.comparators):
            yield node.lineno, node.left


def env_reads(text: str) -> list[str]:
    """Where a source text reads a MINILLM_ variable (or keeps a name string to read one) other than through
    minillm/envs.py: 'line: what'."""
    found = [f"{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}" for m in LITERAL_READ.finditer(text)]
    tree = ast.parse(text)
    for line, key in _environ_key_reads(tree):
        spelled = ast.unparse(key)
        # a constant MINILLM_ name, envs' name constants, or a module's own *_ENV alias of one
        if "MINILLM_" in spelled or re.search(r"\benvs\b|_ENV\b", spelled):
            found.append(f"{line}: environ read of {spelled}")
    for node in ast.walk(tree):  # a bare name string: the code means to read (or set) that variable itself
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value.strip()):
            found.append(f"{node.lineno}: the name string {node.value!r} (use the constant in minillm/envs.py)")
    return found


def test_only_envs_reads_minillm_variables():
    offenders = {str(p.relative_to(ROOT)): reads for p in source_files() if (reads := env_reads(p.read_text()))}
    assert not offenders, f"read MINILLM_ variables through minillm/envs.py instead: {offenders}"


@pytest.mark.parametrize("snippet", [
    'import os\nx = os.environ.get("MINILLM_TILED", "")\n',
    'import os\nx = os.environ["MINILLM_TILED"]\n',
    "import os\nx = os.getenv('MINILLM_TILED')\n",
    'import os\nx = "MINILLM_TILED" in os.environ\n',
    'import os\nNAME = "MINILLM_TILED"\nx = os.environ.get(NAME)\n',
    'import os\nfrom minillm import envs\nx = os.environ.get(envs.MINILLM_TILED)\n',
    'import os\nfrom minillm import envs\nTILED_ENV = envs.MINILLM_TILED\nx = os.environ.get(TILED_ENV, "")\n',
])
def test_the_scan_finds_a_read(snippet):
    """The scan above can fail: each way of reading a variable behind envs.py's back is found."""
    assert env_reads(snippet)


def test_the_scan_passes_reads_through_envs():
    ok = ('import os\nfrom minillm import envs\nx = envs.tiled()\ny = os.environ.get("TRITON_INTERPRET")\n'
          'msg = "set MINILLM_TILED=mkl to turn it off"\nos.environ[envs.MINILLM_TILED] = "mkl"\n')
    assert env_reads(ok) == []


def test_envs_imports_only_the_standard_library():
    tree = ast.parse(ENVS_PY.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] in ("minillm", "torch") for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and (node.module or "").split(".")[0] not in ("minillm", "torch"), node.module


def test_every_name_in_the_source_is_declared():
    used = {name for p in [*source_files(), ENVS_PY] for name in NAME.findall(p.read_text())}
    assert used - set(envs.DECLARED) == set(), "declare these in minillm/envs.py (VARIABLES)"
    package = {v.name for v in envs.VARIABLES if not v.script_only}
    assert package - used == set(), "declared as read by the package, but nothing there names them"


def test_declarations():
    names = [v.name for v in envs.VARIABLES]
    assert len(names) == len(set(names))
    for v in envs.VARIABLES:
        assert getattr(envs, v.name) == v.name  # the name constant
        assert v.type in ("str", "choice", "bool", "float", "int", "path"), v
        assert v.default and v.values and v.meaning and v.reader, v


def test_script_only_variables_are_the_scripts():
    """Every MINILLM_ name a script or CI file reads is declared (script-only unless the package reads it too)."""
    texts = [p.read_text() for d in ("scripts", ".ci") for p in (ROOT / d).rglob("*") if p.is_file()]
    used = {name for t in texts for name in NAME.findall(t)}
    assert used - set(envs.DECLARED) == set()


def table_names(text: str) -> list[str]:
    return re.findall(r"^\| `(MINILLM_[A-Z0-9_]+)` \|", text, flags=re.M)


def test_the_book_table_lists_exactly_the_declared_variables():
    text = (ROOT / "book" / "environment.md").read_text()
    assert envs.markdown_table() in text, f"regenerate: {WRITE}"
    assert sorted(table_names(text)) == sorted(envs.DECLARED)
    assert table_names(envs.markdown_table()) == [v.name for v in envs.VARIABLES]


def test_accessors_read_at_call_time(monkeypatch):
    for name in envs.DECLARED:
        monkeypatch.delenv(name, raising=False)
    assert envs.cache_dir() is None and envs.compiled_body() is None and envs.int8_gemm() is None
    assert envs.quant_cpu_route() is None and envs.tiled() == "" and envs.panels() == "" and envs.exercises() == ""
    assert envs.huge_pages() and envs.fused_kernels() and envs.mkl_pack() and envs.ranking_head_q8_0()
    assert envs.compile_direct_calls() and envs.compile_cpp_wrapper() and envs.compile_skip_seen_guards()
    assert not (envs.malloc_system() or envs.gguf_int4() or envs.quant_dequant_fallback())
    assert envs.mkl_pack_mb() == 1024.0
    monkeypatch.setenv(envs.MINILLM_CACHE_DIR, "")
    assert envs.cache_dir() is None  # empty is unset, as every caller had it
    monkeypatch.setenv(envs.MINILLM_CACHE_DIR, "/tmp/x")
    assert envs.cache_dir() == "/tmp/x"
    monkeypatch.setenv(envs.MINILLM_TILED, "MKL")
    assert envs.tiled() == "mkl" and envs.turned_off(envs.MINILLM_TILED, "mkl")
    monkeypatch.setenv(envs.MINILLM_MALLOC, "System")
    assert envs.malloc_system()
    monkeypatch.setenv(envs.MINILLM_MKL_PACK_MB, "0.5")
    assert envs.mkl_pack_mb() == 0.5
    monkeypatch.setenv(envs.MINILLM_HUGE_PAGES, "0")
    monkeypatch.setenv(envs.MINILLM_COMPILE_GUARDS, "always")
    monkeypatch.setenv(envs.MINILLM_COMPILE_WRAPPER, "python")
    assert not (envs.huge_pages() or envs.compile_skip_seen_guards() or envs.compile_cpp_wrapper())
    monkeypatch.setenv(envs.MINILLM_EXERCISES, " learner:sampling ")
    assert envs.exercises() == "learner:sampling"


@pytest.mark.parametrize("name, accessor, bad, message", [
    (envs.MINILLM_COMPILED_BODY, envs.compiled_body, "column", "MINILLM_COMPILED_BODY must be one of"),
    (envs.MINILLM_INT8_GEMM, envs.int8_gemm, "int4", "MINILLM_INT8_GEMM must be 'int_mm' or 'float32'"),
    (envs.MINILLM_QUANT_CPU_ROUTE, envs.quant_cpu_route, "fp16", "MINILLM_QUANT_CPU_ROUTE must be one of"),
    (envs.MINILLM_MKL_PACK_MB, envs.mkl_pack_mb, "lots", "MINILLM_MKL_PACK_MB must be a number"),
])
def test_a_bad_value_is_a_value_error(monkeypatch, name, accessor, bad, message):
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=message):
        accessor()


def test_an_undeclared_name_is_refused():
    with pytest.raises(KeyError, match="not declared"):
        envs.get("MINILLM_NO_SUCH_SWITCH")
