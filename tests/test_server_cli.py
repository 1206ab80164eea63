"""`minillm serve` (minillm.server.cli.main): arguments, and one real start on loopback in a subprocess."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from minillm.server.cli import DEFAULT_MODEL_NAME, build_parser, served_name


def test_arguments():
    a = build_parser().parse_args([])
    assert a.host == "127.0.0.1" and a.model is None and a.max_queue_len == 1024
    assert a.api_key is None and a.max_n is None and a.shutdown_grace == 30.0 and not a.no_warmup
    assert served_name(a) == DEFAULT_MODEL_NAME
    a = build_parser().parse_args(["--model", "/m/qwen.gguf", "--port", "9", "--dtype", "bfloat16", "--max-num-seqs",
                                   "4", "--max-num-batched-tokens", "64", "--kv-cache-mb", "8", "--max-queue-len", "3"])
    assert (a.port, a.dtype, a.max_num_seqs, a.max_num_batched_tokens, a.kv_cache_mb, a.max_queue_len) == \
        (9, "bfloat16", 4, 64, 8, 3)
    assert served_name(a) == "qwen.gguf"
    assert served_name(build_parser().parse_args(["--served-model-name", "x"])) == "x"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.default_model
def test_serve_default_model_subprocess():
    port = _free_port()
    cmd = [sys.executable, "-m", "minillm.server.cli", "--port", str(port), "--kv-cache-mb", "32",
           "--max-num-seqs", "4", "--served-model-name", "smol", "--log-level", "info", "--api-key", "k"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)
        key = {"Authorization": "Bearer k"}
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.get(url + "/v1/models", headers=key).json()["data"][0]["id"] == "smol"
        r = httpx.post(url + "/v1/chat/completions", timeout=60, headers=key, json={
            "model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert "minillm:warmup_seconds" in httpx.get(url + "/metrics").text
        proc.terminate()  # SIGTERM: nothing in flight, so a drained exit at once
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out[-3000:]
        assert "warm-up done in" in out and "KV blocks free" in out, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
