"""Every Triton kernel compiles for sm80 (A100) and sm90 (H100/H200) without a GPU.

The interpreter does not enforce GPU rules (tl.dot needs M, N, K >= 16; layouts;
shared memory), so each kernel is also compiled with
``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))`` through
ttir -> ttgir -> llir -> ptx -> cubin (triton's bundled ptxas), and its shared
memory is checked against the target's limit. Runs in a subprocess because
``triton.jit`` under ``TRITON_INTERPRET=1`` yields uncompilable interpreter objects.
"""
import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_kernels_compile_for_gpu(tmp_path):
    out = tmp_path / "rows.json"
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "minillm.kernels.compile_check", "--arch", "80", "90", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.exists(), proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    failed = [r for r in rows if not r["ok"]]
    assert not failed, json.dumps(failed, indent=1)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert {r["arch"] for r in rows} == {80, 90}
    names = {r["kernel"].split("[")[0] for r in rows}
    assert {"store_kv_cache", "paged_decode", "paged_decode_combine", "prefill", "rms_norm", "rope"} <= names
    # triton ships ptxas, so every kernel goes all the way to a cubin
    assert {r["stage"] for r in rows} == {"cubin"}
