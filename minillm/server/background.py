"""Serve an app from a background thread on a free loopback port (tests, notebooks).

    with ServerThread(create_app(engine)) as srv:
        openai.OpenAI(base_url=srv.url + "/v1", api_key="none").completions.create(...)
"""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from minillm.server.state import READY


class ServerThread:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        # Bind first and hand uvicorn the socket: the port is known and nobody can take it meanwhile.
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on",
                                                   timeout_keep_alive=30, timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="minillm-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 120.0, wait_ready: bool = True) -> "ServerThread":
        """Start serving; with wait_ready, return once a minillm app has warmed up (/health would say 200)."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        state = getattr(getattr(self.server.config.app, "state", None), "server", None)
        while not self.server.started or (wait_ready and state is not None and state.phase != READY):
            if state is not None and state.engine.error is not None:
                raise RuntimeError(f"the engine failed while warming up: {state.engine.error!r}")
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start" if not self.server.started else "the server did not warm up")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> "ServerThread":
        return self if self.thread.is_alive() else self.start()  # `with ServerThread(app).start(...)` too

    def __exit__(self, *exc) -> None:
        self.stop()
