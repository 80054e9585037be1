"""``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` bodies
(docs/api/openai.md#chat-completions, docs/api/openai.md#completions).

Request Structs document the request shapes in ``/openapi.json``; handlers never build them:
they read the Rust validator's ``ValidRequest`` (one pass over the body, every range and
cross-field rule checked). Unknown fields are ignored (docs/api/common.md#request-bodies). Response
Structs encode the documented shapes: a field typed ``... | UnsetType`` is left out unless set.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

Stop = str | list[str] | None
ContentPart = dict[str, Any]


class FunctionCall(Struct):
    name: str
    #: A JSON-encoded string; an object is accepted and re-serialised
    #: (docs/decisions.md#tool-call-arguments).
    arguments: str | dict[str, Any]


class ToolCall(Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class FunctionDefinition(Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Struct):
    function: FunctionDefinition
    type: str = "function"


class ChatMessage(Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class StreamOptions(Struct):
    include_usage: bool | None = None


class _SamplingFields(Struct, kw_only=True):
    """The sampling fields both ``/v1`` routes share (with the vLLM extras)."""

    model: str
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: Stop = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    ignore_eos: bool | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    n: int | None = None
    #: vLLM extra: score the prompt, with this many alternatives per token (not streamed).
    prompt_logprobs: int | None = None


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/chat/completions`` (docs/api/openai.md#chat-request)."""

    messages: list[ChatMessage]
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    #: vLLM extra: keyword arguments for the chat template (``enable_thinking``).
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/completions`` (docs/api/openai.md#completions-request); ``prompt`` may be a list
    of prompts (docs/decisions.md#prompt-lists), a list of token ids, or a list of token-id lists
    (as OpenAI and vLLM). ``max_tokens: 0`` with ``echo`` scores the prompt without generating."""

    prompt: str | list[str | int | list[int]]
    best_of: int | None = None
    use_beam_search: bool | None = None
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Struct):
    """Chat logprobs, OpenAI shape (docs/api/openai.md#chat-logprobs): one entry per generated
    token."""

    content: list[ChatTokenLogprob]


class ResponseMessage(Struct):
    content: str | None
    role: str = "assistant"
    #: The calls the model made (docs/api/openai.md#chat-response: null on the MindIE route when
    #: there are none; left out on Databricks then).
    tool_calls: list[ToolCall] | UnsetType | None = UNSET
    #: vLLM's: the ``<think>`` text when the server splits reasoning (docs/api/openai.md#reasoning;
    #: null when the output had none), left out when it does not.
    reasoning_content: str | UnsetType | None = UNSET


class ChatChoice(Struct):
    index: int
    message: ResponseMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None = None


class ChatCompletion(Struct, kw_only=True):
    """Non-streaming chat response (docs/api/openai.md#chat-response) with MindIE's timing
    extensions."""

    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    #: MindIE extensions (ms, docs/decisions.md#chat-timing-fields); left out on the Databricks
    #: route.
    prefill_time: float | UnsetType | None = UNSET
    decode_time_arr: list[float] | UnsetType = UNSET
    #: vLLM's ``prompt_logprobs``, when the request asked for them.
    prompt_logprobs: PromptLogprobs | UnsetType = UNSET


class DeltaFunction(Struct):
    #: Given once, in the call's first chunk.
    name: str | UnsetType = UNSET
    #: A piece of the JSON-encoded arguments; the pieces of a call join to its arguments.
    arguments: str = ""


class DeltaToolCall(Struct):
    """A streamed piece of call ``index`` (docs/decisions.md#streamed-tool-calls): id, type and name
    in its first chunk."""

    index: int
    function: DeltaFunction
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET


class Delta(Struct):
    #: Null in a chunk that carries only tool-call pieces.
    content: str | None
    role: str = "assistant"
    tool_calls: list[DeltaToolCall] | UnsetType = UNSET
    #: This chunk's piece of the reasoning (docs/api/openai.md#reasoning), left out when none.
    reasoning_content: str | UnsetType = UNSET


class ChatChunkChoice(Struct):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(Struct, kw_only=True):
    """One streamed chat chunk (docs/api/openai.md#chat-stream): ``usage`` and ``full_text`` only on
    the final one."""

    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | UnsetType = UNSET
    full_text: str | UnsetType = UNSET
    err_msg: str | UnsetType = UNSET


class CompletionLogprobs(Struct):
    """Completions logprobs (docs/api/openai.md#completions-logprobs). With ``echo`` the prompt's
    tokens come first, the first of them with a null logprob and null alternatives (nothing comes
    before it)."""

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class PromptTokenLogprob(Struct):
    """vLLM's score of one token at a prompt position."""

    logprob: float
    rank: int
    decoded_token: str


#: vLLM's ``prompt_logprobs``: per prompt token, null for the first, else token id (a string,
#: as JSON keys are) -> its score, for the top alternatives and the prompt's own token.
PromptLogprobs = list[dict[str, PromptTokenLogprob] | None]


class CompletionChoice(Struct):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None
    prompt_logprobs: PromptLogprobs | UnsetType = UNSET


class CompletionUsage(Struct):
    """Usage with MindIE's per-step arrays (docs/api/openai.md#completions-response,
    docs/decisions.md#per-step-usage-arrays)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    batch_size: list[int]
    queue_wait_time: list[int]


class Completion(Struct, kw_only=True):
    """A completions response, or one streamed chunk (``usage`` only on the last)."""

    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | UnsetType = UNSET
    err_msg: str | UnsetType = UNSET


class ModelCard(Struct, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "ferrollm"
    root: str
    max_model_len: int
    #: What the server runs: "generate" or "embed" (``--task``).
    task: str = "generate"
    #: A LoRA adapter's base model (vLLM's field); None for the base model itself.
    parent: str | None = None
    #: What the model takes as input: "text", then any media kinds ("image", "video",
    #: "audio") its content parts may carry (docs/api/openai.md#models).
    modalities: list[str] = msgspec.field(default_factory=lambda: ["text"])


class ModelList(Struct):
    """``GET /v1/models``."""

    data: list[ModelCard]
    object: str = "list"


def encode(value: Struct) -> bytes:
    """JSON bytes of a response Struct."""
    return msgspec.json.encode(value)
