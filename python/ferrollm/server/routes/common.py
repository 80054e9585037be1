"""What the API handlers share: body decoding, the one validation, engine requests, chat
messages for the template, usage and finish reasons."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from ferrollm._core import CompiledGrammar, SamplingParams, ValidRequest, validate
from ferrollm.engine.request import EngineRequest
from ferrollm.server.context import ServerContext
from ferrollm.server.duplicates import duplicate_key
from ferrollm.server.errors import ApiError, bad_request
from ferrollm.server.http import Request

T = TypeVar("T")

#: Routes whose body names the ``model`` (checked against the served one, →A-27).
_MODEL_ROUTES = ("chat", "completions", "embeddings")
#: Routes an embedding server serves (the others need the generation engine).
_EMBED_ROUTES = ("embeddings", "databricks_embeddings")

#: The content part type a text-only model takes (media parts were refused by the validator).
_TEXT = "text"


#: Work on inputs larger than this (characters of a prompt, bytes of a body) runs on a worker
#: thread (`run_sized`): decoding, validating, rendering and tokenizing a 4 MB body would
#: otherwise stall every other stream and the health probes on the event loop.
OFF_LOOP_CHARS = 32 * 1024


async def run_sized(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, on a worker thread when ``size`` (characters of input) is large."""
    if size > OFF_LOOP_CHARS:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


async def read_json(request: Request) -> dict[str, Any]:
    """The request's JSON object (`decode_body`), decoded on a worker thread when the body is
    large: decoding and the duplicate-key scan take time in proportion to its size."""
    return await run_sized(len(request.body), decode_body, request.body)


def decode_body(body: bytes) -> dict[str, Any]:
    """The request's JSON object; 400 for malformed JSON or a non-object."""
    if not body:
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:  # msgspec recurses per nesting level
        raise bad_request(
            "the request body is nested too deeply to decode", code="invalid_json"
        ) from None
    if not isinstance(value, dict):
        raise bad_request(
            f"the request body must be a JSON object; got {type(value).__name__}",
            code="wrong_type",
        )
    try:
        key = duplicate_key(body)
    except RecursionError:
        raise bad_request(
            "the request body is nested too deeply to decode", code="invalid_json"
        ) from None
    if key is not None:
        raise bad_request(
            f"`{key}`: the key appears twice in one JSON object; keys must be unique",
            param=key,
            code="duplicate_key",
        )
    return value


def accept(ctx: ServerContext, route: str, body: Mapping[str, Any]) -> ValidRequest:
    """The request path's one validation: the route's rules (400 naming the field), the
    ``model`` of the ``/v1`` routes (404), then the capability table (400 ``unsupported``)."""
    if route not in _EMBED_ROUTES:
        ctx.generator  # noqa: B018 (400 on an embedding server, before any field is read)
    valid = validate(route, body, ctx.limits)
    if route in _MODEL_ROUTES:
        ctx.check_model(valid.model)
    valid.check_supported()
    return valid


def engine_request(
    valid: ValidRequest,
    request_id: str,
    token_ids: Sequence[int],
    arrival: float,
    *,
    prompt: str | None = None,
    index: int | None = None,
    grammar: CompiledGrammar | None = None,
    keep_special_tokens: bool = False,
) -> EngineRequest:
    """The engine's request for one tokenized prompt of ``valid`` (``index``: its place in a
    batch): cut under ``error_behavior: "truncate"``, then the prompt-token limit and the
    output cap, in one call; ``grammar`` is its compiled structured-output or tool grammar;
    ``keep_special_tokens`` keeps them in the text (a tool-call marker that is one)."""
    ids, params = valid.fit_prompt(token_ids, index)
    if keep_special_tokens:
        params = params.keeping_special_tokens()
    return EngineRequest(request_id, ids, params, arrival, prompt=prompt, grammar=grammar)


def join_text_parts(content: str | Sequence[Mapping[str, Any]] | None) -> str:
    """A text-only model's content: a string, or its text parts joined in order (→A-46)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if part.get("type") == _TEXT)


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as the template sees them: text content joined; tool-call arguments as
    objects (what Hugging Face templates expect), whichever form the client sent."""
    out = []
    for m in messages:
        message: dict[str, Any] = {"role": m["role"], "content": join_text_parts(m.get("content"))}
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None:
                message[key] = m[key]
        if m.get("tool_calls"):
            message["tool_calls"] = [_template_tool_call(c) for c in m["tool_calls"]]
        out.append(message)
    return out


def _template_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {
        "id": call["id"],
        "type": call.get("type", "function"),
        "function": {
            "name": function["name"],
            "arguments": _arguments_object(function["arguments"]),
        },
    }


def _arguments_object(arguments: str | dict[str, Any]) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def usage_counts(num_prompt_tokens: int, outputs: Sequence[Any]) -> tuple[int, int, int]:
    """(prompt, completion, total) tokens; completion counts every returned sequence."""
    completion = sum(len(c.token_ids) for c in outputs)
    return num_prompt_tokens, completion, num_prompt_tokens + completion


def error_message(reason: str | None, params: SamplingParams) -> str | None:
    """``err_msg`` for a request the engine ended abnormally (timeout, abort), else None."""
    if reason == "timeout" and params.timeout_s is None:
        return "request timed out (the server's request_timeout)"
    if reason == "timeout":
        return f"request timed out after {params.timeout_s:g} s"
    if reason == "abort":
        return "request aborted by the server"
    return None


def openai_finish_reason(
    reason: str | None, *, databricks: bool = False, truncate: bool = False
) -> str | None:
    """The ``/v1`` and Databricks finish reason (SPEC 1.13): errors end as "stop" on /v1.
    A Databricks deadline is "decided by ``error_behavior``" (SPEC 6.5): "truncate" returns
    the partial text as "length"; "error" gives no finish reason (None): the stream ends with
    an error event instead, a whole response with 504."""
    if reason is None:
        return None
    if reason == "timeout" and databricks:
        return "length" if truncate else None
    return "length" if reason == "length" else "stop"


def check_deadline(outputs: Sequence[Any], params: SamplingParams, *, truncate: bool) -> None:
    """A whole (non-streamed) response whose request ran past its deadline is a 504 (SPEC
    1.14), unless Databricks ``error_behavior: "truncate"`` asked for the partial text."""
    if truncate or not any(c.finish_reason == "timeout" for c in outputs):
        return
    message = error_message("timeout", params) if params.timeout_s is not None else None
    raise ApiError(
        504, message or "request timed out (the server's request_timeout)", code="timeout"
    )
