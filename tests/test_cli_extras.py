"""Commands check their optional extras first and name the extra to install; `minillm --help` is complete.

What can fail: with an extra's module missing, the command must stop before it loads a model or runs
the demo (it used to die with a raw ModuleNotFoundError at the end), and say `pip install -e ".[extra]"`.
"""
from __future__ import annotations

import pytest

import minillm.extras as extras
from minillm.cli import main as minillm_main

BENCH_COMMANDS = {"latency", "throughput", "serve", "prefix", "spec", "structured", "tp", "quant", "roofs"}


@pytest.fixture()
def without(monkeypatch):
    """Pretend these modules are not installed; loading a model is an error (the check must come first)."""
    import minillm
    import minillm.cli as cli

    def hide(*modules: str) -> None:
        real = extras.installed
        monkeypatch.setattr(extras, "installed", lambda m: m not in modules and real(m))

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the missing extra was reported")

    monkeypatch.setattr(minillm, "LLM", no_model)
    monkeypatch.setattr(cli, "_make_llm", no_model)
    return hide


def test_serve_without_the_server_extra_says_what_to_install(without):
    without("fastapi")
    with pytest.raises(SystemExit) as e:
        minillm_main(["serve", "--port", "0"])
    msg = str(e.value)
    assert "minillm serve" in msg and "'server' extra" in msg and "fastapi" in msg and 'pip install -e ".[server]"' in msg


def test_demo_html_without_plotly_stops_before_the_demo(without, tmp_path):
    without("plotly")
    with pytest.raises(SystemExit) as e:
        minillm_main(["demo", "--html", str(tmp_path / "r.html"), "--num-prompts", "1"])
    assert 'pip install -e ".[notebooks]"' in str(e.value) and "plotly" in str(e.value)
    assert not (tmp_path / "r.html").exists()


def test_bench_serve_without_httpx(without):
    without("httpx", "prometheus_client")
    with pytest.raises(SystemExit) as e:
        minillm_main(["bench", "serve", "--num-requests", "1"])
    assert "httpx, prometheus_client" in str(e.value) and "pip install httpx prometheus-client" in str(e.value)


def test_every_extra_the_checks_name_exists_in_pyproject():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    server = " ".join(pyproject["project"]["optional-dependencies"]["server"])
    notebooks = " ".join(pyproject["project"]["optional-dependencies"]["notebooks"])
    for m in extras.SERVER_MODULES:
        assert extras.PIP_NAMES.get(m, m) in server
    for m in extras.HTML_REPORT_MODULES:
        assert m in notebooks


def test_help_lists_every_bench_subcommand(capsys):
    from minillm.bench.cli import subcommands

    assert set(subcommands()) == BENCH_COMMANDS
    with pytest.raises(SystemExit):
        minillm_main(["--help"])
    import re

    listed = re.search(r"minillm bench\s+\{([^}]*)\}", capsys.readouterr().out).group(1)
    listed = re.sub(r"\s", "", listed).split(",")
    assert set(listed) == BENCH_COMMANDS
