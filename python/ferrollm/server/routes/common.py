"""What the API handlers share: body decoding, validation, prompts, finish reasons, logprobs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from ferrollm._core import SamplingParams, ValidationError, validate
from ferrollm.server.context import ServerContext
from ferrollm.server.errors import ApiError, bad_request, unsupported

S = TypeVar("S", bound=msgspec.Struct)
T = TypeVar("T")

#: The content part type a text-only model takes (media parts were refused by the validator).
_TEXT = "text"


#: Prompts longer than this (characters) are tokenized on a worker thread, so that a 4 MB
#: prompt does not stall every other stream on the event loop.
OFF_LOOP_CHARS = 32 * 1024


async def run_sized(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, on a worker thread when ``size`` (characters of input) is large."""
    if size > OFF_LOOP_CHARS:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


def decode_body(body: bytes) -> dict[str, Any]:
    """The request's JSON object; 400 for malformed JSON or a non-object."""
    if not body:
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(value, dict):
        raise bad_request(
            f"the request body must be a JSON object; got {type(value).__name__}",
            code="wrong_type",
        )
    return value


def check(
    ctx: ServerContext, route: str, body: Mapping[str, Any], num_prompt_tokens: int | None = None
) -> SamplingParams:
    """Rust validation of ``body`` for ``route`` (raises ValidationError -> 400)."""
    return validate(route, body, num_prompt_tokens, ctx.limits)


def typed(body: Mapping[str, Any], struct: type[S]) -> S:
    """The validated body as the route's Struct (a failure here means the Struct and the
    validator disagree; it is still the client's 400, naming the field msgspec names)."""
    try:
        return msgspec.convert(body, struct)
    except msgspec.ValidationError as e:
        raise bad_request(f"invalid request: {e}", code="wrong_type") from None


def prompt_param(name: str, index: int | None) -> str:
    """``prompt`` or ``prompt[i]`` for a batch."""
    return name if index is None else f"{name}[{index}]"


def check_prompt(
    ctx: ServerContext,
    route: str,
    body: Mapping[str, Any],
    num_prompt_tokens: int,
    param: str,
) -> SamplingParams:
    """Validation with the prompt's token count (limits of SPEC 1.4, cap of SPEC 1.5); a
    prompt error names ``param`` (``prompt[2]`` in a batch)."""
    try:
        return check(ctx, route, body, num_prompt_tokens)
    except ValidationError as e:
        if e.param in ("prompt", "messages", "text_input", "input"):
            raise ApiError(400, str(e).replace(f"`{e.param}`", f"`{param}`"), param=param,
                           code=e.code) from None  # fmt: skip
        raise


def join_text_parts(content: str | Sequence[Mapping[str, Any]] | None) -> str:
    """A text-only model's content: a string, or its text parts joined in order (→A-46)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if part.get("type") == _TEXT)


def template_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Chat messages as the template sees them: text content joined; tool-call arguments as
    objects (what Hugging Face templates expect), whichever form the client sent."""
    out = []
    for m in messages:
        message: dict[str, Any] = {"role": m.role, "content": join_text_parts(m.content)}
        if m.name is not None:
            message["name"] = m.name
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": c.type,
                    "function": {
                        "name": c.function.name,
                        "arguments": _arguments_object(c.function.arguments),
                    },
                }
                for c in m.tool_calls
            ]
        out.append(message)
    return out


def _arguments_object(arguments: str | dict[str, Any]) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def check_tools(tools: Sequence[Any] | None, tool_choice: str | Mapping[str, Any] | None) -> bool:
    """Whether ``tools`` go to the template. No tool-call parser is built yet, so tools the
    model may call are refused (→A-39); with ``tool_choice: "none"`` they are only shown."""
    if not tools:
        return False
    if tool_choice != "none":
        raise unsupported(
            "tools",
            "this model does not support tool calling (no tool-call parser is built yet); "
            'send `tool_choice: "none"` or leave `tools` out',
        )
    return True


def check_response_format(response_format: Mapping[str, Any] | None) -> None:
    """Only ``{"type": "text"}``: JSON modes need constrained decoding, not built yet (→A-69)."""
    if response_format is not None and response_format.get("type") != "text":
        raise unsupported(
            "response_format",
            f"`{response_format.get('type')}` is not supported yet (constrained decoding is "
            'not built); only `{"type": "text"}` is accepted',
        )


def usage_counts(num_prompt_tokens: int, outputs: Sequence[Any]) -> tuple[int, int, int]:
    """(prompt, completion, total) tokens; completion counts every returned sequence."""
    completion = sum(len(c.token_ids) for c in outputs)
    return num_prompt_tokens, completion, num_prompt_tokens + completion


def error_message(reason: str | None, params: SamplingParams) -> str | None:
    """``err_msg`` for a request the engine ended abnormally (timeout, abort), else None."""
    if reason == "timeout":
        return f"request timed out after {params.timeout_s:g} s"
    if reason == "abort":
        return "request aborted by the server"
    return None


def openai_finish_reason(reason: str | None) -> str | None:
    """The ``/v1`` and Databricks finish reason (SPEC 1.13): errors end as "stop"."""
    if reason is None:
        return None
    return "length" if reason == "length" else "stop"
