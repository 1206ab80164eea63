"""Request and response bodies of the OpenAI-compatible API, as Pydantic models.

Requests ignore fields they do not know (clients send many optional ones) but
validate the ones they do; the extras vLLM accepts (top_k, min_p, ignore_eos,
min_tokens, stop_token_ids, structured_outputs and the older guided_*, ...) are
understood here too.
"""
from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StringConstraints, model_validator
from pydantic_core import PydanticCustomError
from typing_extensions import Annotated

from minillm.structured_outputs import MAX_CHOICES

# Lists every decode step walks (each new token is checked against every stop string) are bounded here, so a
# client cannot make every step of every request slower, and the OpenAPI document states the bounds.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 512
MAX_STOP_TOKEN_IDS = 256

StopString = Annotated[str, StringConstraints(max_length=MAX_STOP_CHARS)]
# A structured output's spec is parsed when the request arrives (on the event loop) and compiled for
# the vocabulary off it; its texts are bounded here, below the body limit.
MAX_PATTERN_CHARS = 64 * 1024  # a regex or a grammar
MAX_CHOICE_CHARS = 4096  # one choice
Pattern = Annotated[str, StringConstraints(max_length=MAX_PATTERN_CHARS)]
Choices = Annotated[list[Annotated[str, StringConstraints(max_length=MAX_CHOICE_CHARS)]],
                    Field(max_length=MAX_CHOICES)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False


# ----- structured outputs -----------------------------------------------------------
# OpenAI's response_format, vLLM's structured_outputs and vLLM's older guided_* fields: at most one
# of them constrains a request (server/sampling.py turns it into a StructuredOutputs).


class JsonSchemaFormat(_Request):
    """response_format.json_schema: the schema itself is under "schema" (OpenAI's name)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)  # schema_ by its own name too

    name: Annotated[str, StringConstraints(max_length=256)]
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None  # the schema is always enforced, strict or not


class ResponseFormat(_Request):
    """OpenAI's response_format: {"type": "text"} (the default), {"type": "json_object"} or
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}. One model rather than a
    union tagged by "type", so an error's path is the body's own (response_format.json_schema.name)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise PydanticCustomError("missing", 'type "json_schema" needs a json_schema object: '
                                      '{"name": ..., "schema": {...}}')
        return self


class StructuredOutputsFields(_Request):
    """vLLM's structured_outputs: exactly one of these (minillm/structured_outputs.py). Unknown keys are
    refused rather than ignored: a misspelt constraint must not turn into an unconstrained request."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | Pattern | None = Field(default=None, alias="json")  # a schema, or its text
    json_object: bool | None = None
    regex: Pattern | None = None
    choice: Choices | None = None
    grammar: Pattern | None = None


class SamplingFields(_Request):
    """The sampling knobs both endpoints share (OpenAI's plus vLLM's extras)."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None  # OpenAI's default: 1.0
    top_p: float | None = None
    seed: int | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: Annotated[list[int], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    skip_special_tokens: bool = True
    repetition_penalty: float | None = None
    # vLLM's: a text prompt's BOS/EOS; None: the tokenizer's rule (completions), the template's (chat: False)
    add_special_tokens: StrictBool | None = None
    priority: StrictInt = 0  # vLLM's: lower is served first when the server runs --scheduling-policy priority
    # structured outputs: OpenAI's, vLLM's, vLLM's older names (at most one of them per request)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsFields | None = None
    guided_json: dict[str, Any] | Pattern | None = None
    guided_regex: Pattern | None = None
    guided_choice: Choices | None = None
    guided_grammar: Pattern | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ChatMessage(_Request):
    role: str
    # a string, or OpenAI's list of content parts ({"type": "text", "text": ...})
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True


# ----- responses ------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    """The legacy completions format: parallel lists, one entry per token."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "minillm"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
