"""The llama.cpp peer: said clearly when missing; when installed, the real library on the default GGUF.

The not-installed path is exercised by hiding the package the way Python's import
system itself allows (sys.modules[name] = None), so it runs whether or not this
machine has llama-cpp-python. The subject tests skip when it is not installed
(CI does not build it); they check llama.cpp's logits against transformers'
(speed is compared between engines, correctness against transformers) and that
batched serving over several sequence ids returns every requested token.
"""
from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
import torch

from minillm.bench.cli import main
from minillm.bench.llamacpp_subject import NOT_INSTALLED, llama_cpp_available, load_llama_cpp, probe_llama_cpp
from tests.helpers.tiny_models import make_tiny_hf_model

INSTALLED = importlib.util.find_spec("llama_cpp") is not None




def test_missing_llama_cpp_is_said_in_output_and_json(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now fails as if not installed
    ok, why = llama_cpp_available()
    assert not ok and why == NOT_INSTALLED and "not installed" in why
    with pytest.raises(ImportError, match="not installed"):
        load_llama_cpp("any.gguf", repack=False, n_threads=1)
    folder, _ = make_tiny_hf_model(tmp_path / "m", "llama")
    out = tmp_path / "lat.json"
    argv = ["latency", "--model", str(folder), "--compare", "llama.cpp", "--no-roofs", "--quiet", "--prompt-len", "4",
            "--output-len", "3", "--prefill-len", "8", "--repeats", "1", "--prefill-repeats", "1", "--json", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "llama-cpp-python is not installed" in captured.out and "not installed" in captured.err
    report = json.loads(out.read_text())
    lc = report["settings"]["llama_cpp"]
    assert lc["notes"] == {"llama.cpp": NOT_INSTALLED} and "llama_batch" in lc["driven"]
    assert list(report["figures"]) == ["minillm"] and report["settings"]["compare"] == ["llama.cpp"]


def test_compare_rejects_unknown_peers():
    with pytest.raises(SystemExit):
        main(["latency", "--compare", "vllm"])


needs_llama_cpp = pytest.mark.skipif(not INSTALLED, reason="llama-cpp-python is not installed (optional extra `peers`)")


@pytest.fixture(scope="module")
def gguf_path():
    from minillm.loader import default_model_path

    return str(default_model_path())


_PROBED: dict[bool, str | None] = {}


def runs_here(gguf_path: str, repack: bool) -> None:
    """Skip, saying why, where this build of llama.cpp crashes (a SIGSEGV would end the whole pytest
    process: llama-cpp-python 0.3.36 built with AMX does so on the first decode with repacking on an
    AMX Xeon). The probe runs in a child process, once per setting."""
    if repack not in _PROBED:
        _PROBED[repack] = probe_llama_cpp(gguf_path, repack)
    if _PROBED[repack]:
        pytest.skip(f"this llama.cpp build fails here: {_PROBED[repack]}")


@needs_llama_cpp
@pytest.mark.slow
@pytest.mark.default_model
@pytest.mark.parametrize("repack", [False, True])
def test_llama_cpp_logits_match_transformers(gguf_path, hf_default_reference, repack):
    runs_here(gguf_path, repack)
    got, ref = last_logits(gguf_path, repack, hf_default_reference)
    assert got.shape == ref.shape
    # llama.cpp multiplies Q4_1 weights with 8-bit-quantized activations; transformers dequantizes to float
    assert int(got.argmax()) == int(ref.argmax())
    assert np.corrcoef(got, ref)[0, 1] > 0.99


def last_logits(gguf_path: str, repack: bool, hf_default_reference) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's and transformers' logits after one everyday prompt (the same token ids)."""
    subject = load_llama_cpp(gguf_path, repack=repack, n_threads=1)
    try:
        prompt = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 28, 1026, 1187, 3817, 30]
        got = subject.logits(prompt)
    finally:
        subject.close()
    with torch.no_grad():
        ref = hf_default_reference(torch.tensor([prompt])).logits[0, -1].float().numpy()
    return got, ref


@needs_llama_cpp
@pytest.mark.slow
@pytest.mark.default_model
def test_llama_cpp_serves_batched_and_decodes(gguf_path):
    runs_here(gguf_path, False)
    subject = load_llama_cpp(gguf_path, repack=False, n_threads=1, max_num_seqs=3)
    try:
        prompts = [[1, 2, 3, 4, 5] * k for k in (1, 2, 3, 4)]  # 4 requests over 3 slots: one waits for a slot
        outs = [3, 5, 2, 4]
        run = subject.serve(prompts, outs)
        assert run.output_tokens == run.generated_tokens == sum(outs)
        assert run.prompt_tokens == sum(map(len, prompts))
        assert len(run.ttft_s) == 4 and all(0 < t <= run.wall_s for t in run.ttft_s)
        assert len(run.tpot_s) == 4 and all(t > 0 for t in run.tpot_s)
        # batched: fewer llama_decode calls than the tokens produced one sequence at a time would need
        assert run.num_steps < sum(outs)
        d = subject.decode(prompts[0], 6)
        assert d.num_output_tokens == 6 and d.ttft_s > 0 and d.decode_tok_s > 0
        assert subject.prefill(prompts[3]) > 0
    finally:
        subject.close()


@needs_llama_cpp
@pytest.mark.slow
@pytest.mark.default_model
def test_probe_runs_in_a_child_and_reports_failures(gguf_path, tmp_path):
    from minillm.bench.llamacpp_subject import probe_llama_cpp

    assert probe_llama_cpp(gguf_path, repack=False) is None
    why = probe_llama_cpp(str(tmp_path / "missing.gguf"), repack=True)
    assert why.startswith("repack=1: a probe load + decode failed (exit code 1)") and "could not load" in why


@needs_llama_cpp
@pytest.mark.slow
@pytest.mark.default_model
def test_a_float_run_compares_llama_cpp_on_the_same_weights_in_float32(gguf_path, hf_default_reference, tmp_path):
    """`bench latency --dtype float32 --compare llama.cpp`: llama.cpp reads the default model's weights in
    float32 as minillm does (a copy its own quantizer writes from the Q4_1 file, once), so its logits are
    transformers' float ones to float32 rounding -- not the 8-bit-activation Q4_1 products'."""
    import gguf
    from minillm.bench.llamacpp_subject import float_gguf

    path = float_gguf(gguf_path, "float32", cache_dir=str(tmp_path))
    assert path.endswith(".gguf") and ".float32." in path
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types and set(types.values()) == {"F32"}, types
    written = (tmp_path / path.split("/")[-1]).stat().st_mtime_ns
    assert float_gguf(gguf_path, "float32", cache_dir=str(tmp_path)) == path  # reused, not written again
    assert (tmp_path / path.split("/")[-1]).stat().st_mtime_ns == written
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        float_gguf(gguf_path, "int8", cache_dir=str(tmp_path))
    got, ref = last_logits(path, True, hf_default_reference)
    assert int(got.argmax()) == int(ref.argmax())
    assert np.abs(got - ref).max() < 2e-2 * np.abs(ref).max(), np.abs(got - ref).max()
    assert np.corrcoef(got, ref)[0, 1] > 0.99999  # the Q4_1 file's logits: 0.99899


@needs_llama_cpp
@pytest.mark.slow
@pytest.mark.default_model
def test_float_latency_runs_name_the_float_llama_cpp_peer(tmp_path, one_thread):
    out = tmp_path / "lat.json"
    argv = ["latency", "--dtype", "float32", "--compare", "llama.cpp", "--no-roofs", "--quiet", "--prompt-len", "4",
            "--output-len", "3", "--prefill-len", "8", "--repeats", "1", "--prefill-repeats", "1", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert list(report["figures"]) == ["minillm", "llama.cpp-float32"]  # one peer: no repacking for floats
    assert ".float32." in report["settings"]["llama_cpp"]["gguf"]
