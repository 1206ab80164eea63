"""Launch `python -m minillm ...` on several torchrun "nodes" of this machine (loopback only).

    with TorchrunNodes([1, 1], ["generate", "hi", "--tensor-parallel-size", "2"], tmp_path) as nodes:
        nodes.wait(timeout_s=120)
        nodes.log(0)                 # node 0's torchrun output (rank 0's stdout and stderr in it)

Each node is one `torch.distributed.run` agent with a static rendezvous on 127.0.0.1:<free port>,
its worker ranks its children; leaving the block kills whatever is still running.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from minillm.parallel.group import free_port

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GROUP_RANK", "TORCHELASTIC_RUN_ID")


class TorchrunNodes:
    def __init__(self, procs_per_node: list[int], args: list[str], log_dir: Path) -> None:
        self.procs_per_node, self.args, self.log_dir = procs_per_node, args, Path(log_dir)
        self.agents: list[subprocess.Popen] = []

    def __enter__(self) -> "TorchrunNodes":
        port = free_port()
        # one thread per rank: several ranks share 2 cores; none of this test's torchrun variables leak in
        env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
        env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        for node, nproc in enumerate(self.procs_per_node):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(self.procs_per_node)),
                   "--nproc-per-node", str(nproc), "--node-rank", str(node), "--master-addr", "127.0.0.1",
                   "--master-port", str(port), "-m", "minillm", *self.args]
            log = open(self.log_path(node), "w")
            self.agents.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT))
            log.close()  # the child holds its own descriptor
        return self

    def __exit__(self, *exc) -> None:
        for agent in self.agents:
            try:
                tree = psutil.Process(agent.pid).children(recursive=True) + [psutil.Process(agent.pid)]
            except psutil.NoSuchProcess:
                continue
            for p in tree:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            agent.wait(10)

    def log_path(self, node: int) -> Path:
        return self.log_dir / f"node{node}.log"

    def log(self, node: int) -> str:
        return self.log_path(node).read_text(errors="replace")

    def ranks(self) -> dict[int, psutil.Process]:
        """The minillm worker processes by their RANK (read from each one's environment)."""
        out = {}
        for agent in self.agents:
            for child in psutil.Process(agent.pid).children(recursive=True):
                try:
                    env = child.environ()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                if "RANK" in env and "minillm" in child.cmdline():
                    out[int(env["RANK"])] = child
        return out

    def dump_stacks(self) -> None:
        """Every rank still running writes its threads' Python stacks into its node's log (SIGUSR1)."""
        for proc in self.ranks().values():
            try:
                proc.send_signal(signal.SIGUSR1)
            except psutil.NoSuchProcess:
                pass
        time.sleep(1.0)

    def wait(self, timeout_s: float) -> list[int]:
        """Every agent's exit code; AssertionError naming the nodes still running after timeout_s."""
        deadline = time.monotonic() + timeout_s
        for node, agent in enumerate(self.agents):
            try:
                agent.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.dump_stacks()
                raise AssertionError(f"torchrun node {node} still running after {timeout_s:.0f} s:\n"
                                     f"{self.log(node)[-3000:]}") from None
        return [a.returncode for a in self.agents]
