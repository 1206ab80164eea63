"""OpenAI-style errors: one exception type, one JSON body shape.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}
"""
from __future__ import annotations

from fastapi.responses import JSONResponse

from minillm.server.async_engine import EngineDeadError, EngineFailedError, ServerShuttingDown
from minillm.server.protocol import ErrorInfo, ErrorResponse


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code))

    def response(self) -> JSONResponse:
        return JSONResponse(self.body().model_dump(), status_code=self.status)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def engine_error(e: BaseException) -> APIError:
    """What a client is told when the engine ended its request: no internal text (the server logs that)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, EngineFailedError):
        return APIError(500, str(e), "internal_error", code="engine_failed")
    if isinstance(e, ServerShuttingDown):
        return APIError(503, f"{e}; the request was aborted", "service_unavailable", code="shutting_down")
    if isinstance(e, EngineDeadError):
        return APIError(503, "the engine is not running", "service_unavailable", code="engine_unavailable")
    return internal_error()


def internal_error() -> APIError:
    return APIError(500, "internal server error; the server's log has the details", "internal_error")
