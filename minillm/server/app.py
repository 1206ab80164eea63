"""The FastAPI app: OpenAI-compatible routes over one engine loop, plus /metrics and /health.

    app = create_app(engine, model_name="tiny")   # an LLMEngine you built (tests), or:
    app = create_app(LLM().engine)                # the default model; `minillm serve` does this
    uvicorn.run(app, host="127.0.0.1", port=8000)

Errors always have OpenAI's shape `{"error": {"message", "type", "param", "code"}}`:
bad input is a 400 (never a 422 or a 500), an unknown model 404, a full
queue 429, a stopped engine 503.
"""
from __future__ import annotations

import copy
import logging
from contextlib import asynccontextmanager
from typing import Any, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from minillm.engine.llm_engine import LLMEngine
from minillm.metrics.prometheus import TraceMetrics
from minillm.server.async_engine import AsyncEngine, EngineDeadError
from minillm.server.chat import create_chat_completion
from minillm.server.completions import create_completion
from minillm.server.errors import APIError, bad_request
from minillm.server.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from minillm.server.state import ServerState

log = logging.getLogger("minillm.server")


def _own_copy(tokenizer: Any | None) -> Any | None:
    try:
        return copy.deepcopy(tokenizer)
    except Exception:  # not copyable: share it (fine for tokenizers that are thread-safe)
        return tokenizer


def validation_error(errors: Sequence[Any]) -> APIError:
    """Pydantic's errors -> one 400 naming the top-level field (OpenAI's `param`)."""
    if not errors:
        return bad_request("invalid request body")
    if errors[0].get("type") == "json_invalid":
        return bad_request(f"the body is not valid JSON: {errors[0].get('ctx', {}).get('error', '')}".rstrip(": "))
    locs = [[str(x) for x in err.get("loc", ()) if x != "body"] for err in errors]
    param = locs[0][0] if locs[0] else None
    if param is None:
        return bad_request(str(errors[0].get("msg", "invalid request body")))
    same = [loc for loc in locs if loc[:1] == [param]]
    if len(same) > 1:  # a union field: every accepted form failed
        forms = list(dict.fromkeys(loc[1] for loc in same if len(loc) > 1))
        return bad_request(f"{param}: invalid value; accepted forms: {', '.join(forms)}", param)
    return bad_request(f"{'.'.join(locs[0])}: {errors[0].get('msg', 'invalid value')}", param)


def create_app(engine: LLMEngine, tokenizer: Any | None = None, model_name: str = "minillm",
               max_queue_len: int = 1024, trace_window: int | None = 1024) -> FastAPI:
    """tokenizer: for prompts, the chat template and logprob token strings (default: the engine's).

    The engine itself must have a tokenizer to return text; without one, send token ids and read
    token ids (completions only).
    """
    metrics = TraceMetrics(model_name)
    async_engine = AsyncEngine(engine, [metrics.observe], trace_window)
    state = ServerState(async_engine, _own_copy(tokenizer if tokenizer is not None else engine.tokenizer),
                        model_name, engine.max_model_len, max_queue_len, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        try:
            yield
        finally:
            async_engine.shutdown()

    app = FastAPI(title="minillm", lifespan=lifespan)
    app.state.server = state

    # ----- errors -----------------------------------------------------------------------
    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return validation_error(e.errors()).response()

    @app.exception_handler(EngineDeadError)
    async def dead(_: Request, e: EngineDeadError) -> JSONResponse:
        return APIError(503, str(e), "service_unavailable", code="engine_unavailable").response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return APIError(e.status_code, str(e.detail), kind).response()

    @app.exception_handler(Exception)
    async def internal(_: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return APIError(500, f"internal error: {type(e).__name__}: {e}", "internal_error").response()

    # ----- routes ----------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request) -> Response:
        return await create_completion(req, raw, state)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, raw: Request) -> Response:
        return await create_chat_completion(req, raw, state)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model_name, root=model_name, max_model_len=state.max_model_len)])

    @app.get("/health")
    async def health() -> Response:
        if not async_engine.is_healthy:
            raise EngineDeadError(f"engine stopped: {async_engine.error!r}")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
