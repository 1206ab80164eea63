"""Prompts to token ids on the handler side, so a prompt that cannot fit is refused before it queues.

Text is encoded as LLM.generate encodes it (engine/request.encode_text): with the
tokenizer's own special tokens unless the request says otherwise; a chat prompt
gets the model's chat template, whose text holds whatever special tokens it needs.
"""
from __future__ import annotations

from minillm.engine.request import encode_text
from minillm.server.errors import bad_request
from minillm.server.protocol import ChatMessage
from minillm.server.state import ServerState


def encode(state: ServerState, prompt: str | list[int], param: str = "prompt",
           add_special_tokens: bool | None = None) -> list[int]:
    if isinstance(prompt, str):
        if state.tokenizer is None:
            raise bad_request("this server has no tokenizer: send the prompt as token ids", param)
        ids = encode_text(state.tokenizer, prompt, add_special_tokens)
    else:
        ids = list(prompt)
    if not ids:
        raise bad_request("the prompt is empty", param)
    return ids


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


def chat_prompt(state: ServerState, messages: list[ChatMessage], add_generation_prompt: bool) -> str:
    tok = state.tokenizer
    if tok is None or getattr(tok, "chat_template", None) is None:
        raise bad_request("this model has no chat template; use /v1/completions", "messages")
    conv = [{"role": m.role, "content": _text_of(m, i)} for i, m in enumerate(messages)]
    try:
        return tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # the template's own checks (e.g. roles must alternate) are the client's problem
        raise bad_request(f"the chat template refused these messages: {e}", "messages") from e
