"""Prompts to token ids on the handler side, so a prompt that cannot fit is refused before it queues.

Text is encoded as LLM.generate encodes it (engine/request.encode_text): with the
tokenizer's own special tokens unless the request says otherwise; a chat prompt
gets the model's chat template, whose text holds whatever special tokens it needs.
Templating and tokenizing run on the server's prompt thread (ServerState.off_loop),
after a size check that needs no tokenizer (limits.check_text_fits).
"""
from __future__ import annotations

from typing import Any, Sequence

from minillm.engine.request import encode_text
from minillm.server.errors import bad_request
from minillm.server.limits import check_text_fits
from minillm.server.protocol import ChatMessage
from minillm.server.state import ServerState


def _encode(tokenizer: Any | None, prompt: str | list[int], param: str, add_special_tokens: bool | None) -> list[int]:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise bad_request("this server has no tokenizer: send the prompt as token ids", param)
        ids = encode_text(tokenizer, prompt, add_special_tokens)
    else:
        ids = list(prompt)
    if not ids:
        raise bad_request("the prompt is empty", param)
    return ids


async def encode_all(state: ServerState, prompts: Sequence[str | list[int]], param: str = "prompt",
                     add_special_tokens: bool | None = None) -> list[list[int]]:
    """Token ids of each prompt; a text too long for the context is refused before it is tokenized."""
    for p in prompts:
        if isinstance(p, str):
            check_text_fits(p, state.max_model_len, state.token_bytes, param)
    if all(not isinstance(p, str) for p in prompts):
        return [_encode(None, p, param, add_special_tokens) for p in prompts]
    return await state.off_loop(lambda: [_encode(state.prompt_tokenizer, p, param, add_special_tokens)
                                         for p in prompts])


def check_max_tokens(state: ServerState, max_tokens: int | None) -> None:
    """max_tokens alone must leave a token for the prompt (checked before any tokenizing)."""
    if max_tokens is not None and max_tokens >= state.max_model_len:
        raise bad_request(f"max_tokens must be less than this model's context length ({state.max_model_len} tokens), "
                          f"got {max_tokens}", "max_tokens", "context_length_exceeded")


def check_context(state: ServerState, ids: list[int], max_tokens: int | None, param: str = "prompt") -> None:
    """Like OpenAI: the prompt plus max_tokens must fit the model's context."""
    limit = state.max_model_len
    if len(ids) >= limit:
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, your prompt has {len(ids)} tokens "
            f"(at least one token must be left to generate). Please reduce the length of the prompt.",
            param, "context_length_exceeded")
    if max_tokens is not None and len(ids) + max_tokens > limit:
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the completion). "
            f"Please reduce the length of the prompt or the completion.",
            "max_tokens", "context_length_exceeded")


def _text_of(msg: ChatMessage, i: int) -> str:
    if msg.content is None or isinstance(msg.content, str):
        return msg.content or ""
    parts = []
    for part in msg.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"messages[{i}]: only text content parts are supported", "messages")
        parts.append(part["text"])
    return "".join(parts)


def _render(tokenizer: Any, conv: list[dict[str, str]], add_generation_prompt: bool) -> str:
    try:
        return tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # the template's own checks (e.g. roles must alternate) are the client's problem
        raise bad_request(f"the chat template refused these messages: {e}", "messages") from e


async def chat_ids(state: ServerState, messages: list[ChatMessage], add_generation_prompt: bool,
                   add_special_tokens: bool) -> list[int]:
    """The conversation through the model's chat template, then tokenized; both on the prompt thread."""
    tok = state.prompt_tokenizer
    if tok is None or getattr(tok, "chat_template", None) is None:
        raise bad_request("this model has no chat template; use /v1/completions", "messages")
    conv = [{"role": m.role, "content": _text_of(m, i)} for i, m in enumerate(messages)]
    check_text_fits("".join(m["content"] for m in conv), state.max_model_len, state.token_bytes, "messages")
    text = await state.off_loop(_render, tok, conv, add_generation_prompt)
    # the template's text decides the special tokens (vLLM's rule): no second BOS unless asked for
    return (await encode_all(state, [text], "messages", add_special_tokens))[0]


def warm_prompt_path(tokenizer: Any) -> None:
    """Render and encode one short conversation, as a chat request would (the server's warm-up)."""
    text = "Hello"
    if getattr(tokenizer, "chat_template", None) is not None:
        text = _render(tokenizer, [{"role": "user", "content": text}], True)
    encode_text(tokenizer, text, None)
