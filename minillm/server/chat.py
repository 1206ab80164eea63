"""POST /v1/chat/completions: the model's chat template, then the same engine path as completions."""
from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import Response

from minillm.engine.outputs import RequestOutput
from minillm.sampling_params import MAX_LOGPROBS
from minillm.server import prompts
from minillm.server.deltas import Cursor, chat_logprobs
from minillm.server.errors import bad_request
from minillm.server.protocol import (ChatChoice, ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse,
                                     ChatResponseMessage, ChatStreamChoice, DeltaMessage, UsageInfo)
from minillm.server.sampling import to_sampling_params
from minillm.server.state import ServerState
from minillm.server.streams import SSEResponse, Submitted, sse, sse_error, unless_disconnected


def _top_logprobs(req: ChatCompletionRequest) -> int | None:
    """OpenAI: logprobs (bool) turns them on; top_logprobs (0..20) asks for alternatives and needs logprobs."""
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
        if not 0 <= req.top_logprobs <= MAX_LOGPROBS:
            raise bad_request(f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {req.top_logprobs}",
                              "top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None


async def create_chat_completion(req: ChatCompletionRequest, raw: Request, state: ServerState) -> Response:
    state.check_admitting()
    state.check_model(req.model)
    state.limits.check_n(req.n)
    k = _top_logprobs(req)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    prompts.check_max_tokens(state, max_tokens)
    params = to_sampling_params(req, max_tokens, k)
    state.check_capacity(params.n)  # before any templating or tokenizing
    ids = await prompts.chat_ids(state, req.messages, req.add_generation_prompt, bool(req.add_special_tokens))
    prompts.check_context(state, ids, params.max_tokens, "messages")
    state.check_capacity(params.n)

    rid = f"chatcmpl-{uuid.uuid4().hex}"
    sub = Submitted(state.engine)
    await sub.add(rid, ids, params, req.priority)
    cursors = [Cursor() for _ in range(params.n)]
    created = int(time.time())
    usage = UsageInfo(prompt_tokens=len(ids))

    def logprobs(ids: list[int], lps: list[dict[int, float]]):
        return chat_logprobs(state.tokenizer, ids, lps, k) if k is not None else None

    def chunk(choices: list[ChatStreamChoice], usage: UsageInfo | None = None) -> str:
        return sse(ChatCompletionChunk(id=rid, created=created, model=state.model_name, choices=choices, usage=usage))

    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        async def events():
            try:
                # OpenAI opens each choice with the role and empty content
                yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                             for i in range(params.n)])
                async for _, out in sub.outputs():
                    choices = []
                    for c in out.outputs:
                        d = cursors[c.index].advance(c, with_tokens=k is not None)
                        if d is None:
                            continue
                        if d.finish_reason is not None:
                            usage.completion_tokens += len(c.token_ids)
                        choices.append(ChatStreamChoice(
                            index=c.index, delta=DeltaMessage(content=d.text),
                            logprobs=logprobs(d.token_ids, d.logprobs),
                            finish_reason=d.finish_reason, stop_reason=d.stop_reason))
                    if choices:
                        yield chunk(choices)
                if include_usage:
                    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
                    yield chunk([], usage)
            except Exception as e:  # the engine stopped mid-stream: tell the client, then end the stream
                yield sse_error(e)
            finally:
                sub.close()
            yield sse("[DONE]")

        return SSEResponse(events(), on_close=sub.close)

    async def collect() -> ChatCompletionResponse:
        final: RequestOutput | None = None
        try:
            async for _, out in sub.outputs():
                final = out
        finally:
            sub.close()
        assert final is not None and final.finished
        choices = []
        for c in final.outputs:
            choices.append(ChatChoice(index=c.index, message=ChatResponseMessage(content=c.text),
                                      logprobs=logprobs(c.token_ids, c.logprobs or []),
                                      finish_reason=c.finish_reason, stop_reason=c.stop_reason))
            usage.completion_tokens += len(c.token_ids)
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
        return ChatCompletionResponse(id=rid, created=created, model=state.model_name, choices=choices, usage=usage)

    result = await unless_disconnected(raw, collect())
    if result is None:
        return Response(status_code=499)  # the client left; nobody reads this
    return Response(result.model_dump_json(), media_type="application/json")
