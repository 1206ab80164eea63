"""`minillm bench quant` compares with llama.cpp only as measured in the same run, or shows no ratio.

It used to divide by llama.cpp figures typed into the code. What can fail: with llama.cpp missing
the output and the JSON must hold no ratio at all; with a peer, every ratio must be the setting's
median over the peer's median from this run's timings; with llama-cpp-python installed (slow test),
the real library decodes the default GGUF in the same run.
"""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from minillm.bench.cli import main
from minillm.bench.quant import PeerDecodeRow, QuantSubjectRow, format_quant, peer_ratios
from minillm.bench.subject import DecodeRun
from tests.helpers.tiny_models import make_tiny_hf_model

INSTALLED = importlib.util.find_spec("llama_cpp") is not None
QUOTED = ("110", "145", "275")  # the figures once typed into bench/quant.py


def row(setting: str, tok_s: list[float]) -> QuantSubjectRow:
    return QuantSubjectRow(setting, 1000, 100, 50.0, None, 0.1, tok_s)


def test_ratios_come_from_the_peers_measured_in_this_run():
    rows = [row("float", [20.0, 22.0, 21.0]), row("gguf", [40.0, 44.0])]
    peers = [PeerDecodeRow("llama.cpp", [80.0, 84.0, 82.0]), PeerDecodeRow("llama.cpp-norepack", [])]
    ratios = peer_ratios(rows, peers)
    assert ratios == {"float": {"llama.cpp": pytest.approx(21 / 82)}, "gguf": {"llama.cpp": pytest.approx(42 / 82)}}
    text = format_quant(rows, None, peers)
    assert "vs llama.cpp" in text and "0.51" in text and "llama.cpp: 82.0 tok/s (median of 3" in text
    assert "norepack" not in text  # a peer with no timings gets no column


def test_no_peer_no_ratio():
    text = format_quant([row("float", [20.0])], 1e10, [], "llama-cpp-python is not installed")
    assert "not measured in this run (llama-cpp-python is not installed), so no ratio is shown" in text
    assert not any(q in text for q in QUOTED) and " vs " not in text


def test_measure_quant_interleaves_a_peer_on_the_same_prompts(tmp_path):
    from minillm.bench.quant import measure_quant
    from minillm.bench.workload import LatencyWorkload
    from minillm.loader import load_model

    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    loaded = load_model(str(folder))
    seen: list[tuple[int, ...]] = []

    class Peer:
        name = "fake-peer"

        def decode(self, prompt_ids, max_tokens):
            seen.append(tuple(prompt_ids))
            return DecodeRun(ttft_s=0.01, decode_s=0.1, num_output_tokens=max_tokens)

    wl = LatencyWorkload(prompt_len=4, output_len=5, prefill_len=0)
    peer_rows: list[PeerDecodeRow] = []
    rows = measure_quant(loaded, ("float",), wl, None, repeats=2, peers=[Peer()], peer_rows=peer_rows)
    assert [p.name for p in peer_rows] == ["fake-peer"] and peer_rows[0].tok_s == [pytest.approx(40.0)] * 2
    assert len(rows[0].tok_s) == 2
    cfg = loaded.model.config
    assert seen[1:] == [tuple(wl.decode_prompt(r, cfg.vocab_size)) for r in range(2)]  # after the warm-up


def test_cli_without_llama_cpp_reports_no_ratio(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp fails as if not installed
    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    out = tmp_path / "q.json"
    assert main(["quant", "--model", str(folder), "--settings", "float", "--prompt-len", "4", "--output-len", "4",
                 "--repeats", "1", "--no-roofs", "--quiet", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "no ratio is shown" in text and "not installed" in text
    report = json.loads(out.read_text())
    assert report["llama_cpp_decode"] == [] and report["ratios_to_llama_cpp"] == {"float": {}}
    assert "ratio_to_llama_cpp_quoted" not in report["rows"][0]


@pytest.mark.slow
@pytest.mark.skipif(not INSTALLED, reason="llama-cpp-python is not installed (optional extra `peers`)")
def test_cli_measures_llama_cpp_on_the_same_gguf(tmp_path, capsys, one_thread):
    out = tmp_path / "q.json"
    assert main(["quant", "--settings", "gguf", "--prompt-len", "8", "--output-len", "8", "--repeats", "1",
                 "--repack", "0", "--no-roofs", "--quiet", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    (peer,) = report["llama_cpp_decode"]
    assert peer["name"] == "llama.cpp-norepack" and len(peer["tok_s"]) == 1 and peer["tok_s"][0] > 0
    ratio = report["ratios_to_llama_cpp"]["gguf"]["llama.cpp-norepack"]
    assert ratio == pytest.approx(report["rows"][0]["median_tok_s"] / peer["median_tok_s"])
    assert "vs llama.cpp-norepack" in capsys.readouterr().out
