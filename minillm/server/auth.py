"""API keys: `Authorization: Bearer <key>` on the OpenAI routes, as OpenAI and vLLM (`--api-key`) ask.

    minillm serve --api-key s3cret          # or MINILLM_API_KEY=s3cret minillm serve
    openai.OpenAI(base_url="http://host:8000/v1", api_key="s3cret")

/v1/* needs the key; /health and /metrics stay open for probes and scrapers unless
`protect_all` (`--api-key-all-routes`). A wrong or missing key is a 401 with OpenAI's
error body. The comparison takes the same time whatever prefix matches.
"""
from __future__ import annotations

import hmac
import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from minillm.server.errors import APIError

OPEN_PATHS = ("/health", "/metrics")


class ApiKeyCheck:
    """ASGI middleware: refuse a request to a protected path without `Bearer <key>`."""

    def __init__(self, app: ASGIApp, api_key: str, protect_all: bool = False) -> None:
        if not api_key:
            raise ValueError("ApiKeyCheck needs a non-empty key")
        self.app, self.expected, self.protect_all = app, f"Bearer {api_key}".encode(), protect_all

    def protects(self, path: str) -> bool:
        return self.protect_all or not path.startswith(OPEN_PATHS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.protects(scope["path"]):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                why = "no API key was given" if not given else "the API key is not valid"
                err = APIError(401, f"{why}: send `Authorization: Bearer <key>` with this server's key",
                               "invalid_request_error", None, "invalid_api_key")
                await err.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """What `minillm serve` warns at start when anyone on the network could use it, else None."""
    if api_key or is_loopback(host):
        return None
    return (f"serving on {host} without an API key: anyone who can reach this port can use the model; "
            f"pass --api-key (or set MINILLM_API_KEY), or bind 127.0.0.1")
