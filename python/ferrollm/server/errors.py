"""Errors, mapped once: any exception -> `ApiError` (status, field, rule) -> each API's body.

docs/api/common.md#error-bodies: the ``/v1`` routes answer
``{"error": {"message", "type", "param", "code"}}``, the MindIE ``/v2`` routes
``{"error", "error_type"}`` and Databricks ``{"error_code", "message"}``. Validation failures are
400 naming the field; an unexpected exception is a 500 whose details go to the log, never to the
client.
"""

from __future__ import annotations

import enum
import logging

import msgspec

from ferrollm._core import QueueFullError, ValidationError
from ferrollm.media.errors import MediaDependencyError, MediaError
from ferrollm.tokenizer import ChatTemplateError

logger = logging.getLogger("ferrollm.server")

#: Seconds a client is asked to wait after a 503.
RETRY_AFTER_S = 1


class ErrorStyle(enum.Enum):
    """Which API's error body to write."""

    OPENAI = "openai"
    MINDIE = "mindie"
    DATABRICKS = "databricks"


class ApiError(Exception):
    """A request that cannot be served, with its HTTP status and the field at fault."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    """A 400 naming ``param``."""
    return ApiError(400, message, param=param, code=code)


def to_api_error(error: BaseException) -> ApiError:
    """The HTTP form of any exception raised while serving a request."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, ValidationError):
        # An error about the body as a whole (malformed JSON, say) names no field: param "".
        return ApiError(400, str(error), param=error.param or None, code=error.code)
    if isinstance(error, MediaError):
        # A media part the server cannot use: its status, the part's path and the rule broken.
        return ApiError(error.status, error.message, param=error.param, code=error.code)
    if isinstance(error, MediaDependencyError):
        # The media extra is missing (start-up checks it; this is the fallback): not the
        # client's fault, and not a crash either.
        return ApiError(503, str(error), code="media_unavailable")
    if isinstance(error, ChatTemplateError):
        return ApiError(400, str(error), param="messages", code="chat_template_error")
    if isinstance(error, QueueFullError):
        return ApiError(
            503,
            f"the server is overloaded: {error}",
            code="overloaded",
            headers=((b"retry-after", str(RETRY_AFTER_S).encode()),),
        )
    if _is_id_in_use(error):
        return ApiError(409, str(error), param=getattr(error, "param", "id"), code="conflict")
    if isinstance(error, ValueError):  # the engine's own checks of a request
        return ApiError(400, str(error), code="invalid_value")
    if _is_engine_dead(error):
        fault = _group_fault(error)
        detail = "" if fault is None else f": {fault}"
        return ApiError(503, f"the engine is not running{detail}", code="engine_dead")
    logger.error("request failed", exc_info=error)
    return ApiError(500, "internal server error; see the server log", code="internal_error")


def _is_engine_dead(error: BaseException) -> bool:
    # Imported lazily: the engine package loads torch.
    from ferrollm.engine import EngineDeadError, StepError

    return isinstance(error, (EngineDeadError, StepError))


def _is_id_in_use(error: BaseException) -> bool:
    from ferrollm.engine.async_engine import ClientIdInUse

    return isinstance(error, ClientIdInUse)


def _group_fault(error: BaseException) -> str | None:
    """What broke the tensor-parallel group, when that is why the engine stopped (it names the
    rank and the cause; clients and operators see it in the error)."""
    from ferrollm.distributed.launch import GroupError

    cause = error if isinstance(error, GroupError) else error.__cause__
    return str(cause) if isinstance(cause, GroupError) else None


_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    429: "rate_limit_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    503: "service_unavailable",
    504: "timeout",
}
_MINDIE_TYPES = {
    400: "validation",
    401: "unauthorized",
    429: "too_many_requests",
    404: "not_found",
    405: "method_not_allowed",
    408: "validation",
    409: "conflict",
    413: "validation",
    503: "overloaded",
    504: "timeout",
}
_DATABRICKS_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHENTICATED",
    429: "REQUEST_LIMIT_EXCEEDED",
    404: "RESOURCE_DOES_NOT_EXIST",
    405: "BAD_REQUEST",
    408: "BAD_REQUEST",
    409: "RESOURCE_CONFLICT",
    413: "BAD_REQUEST",
    503: "TEMPORARILY_UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


class _OpenAIError(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(msgspec.Struct):
    """``/v1`` error body."""

    error: _OpenAIError


class MindIEErrorBody(msgspec.Struct):
    """MindIE ``/v2`` error body."""

    error: str
    error_type: str


class DatabricksErrorBody(msgspec.Struct):
    """Databricks error body."""

    error_code: str
    message: str


def error_body(style: ErrorStyle, error: ApiError) -> bytes:
    """The JSON body of ``error`` in ``style``."""
    body: msgspec.Struct
    if style is ErrorStyle.MINDIE:
        body = MindIEErrorBody(error.message, _MINDIE_TYPES.get(error.status, "internal"))
    elif style is ErrorStyle.DATABRICKS:
        body = DatabricksErrorBody(
            _DATABRICKS_CODES.get(error.status, "INTERNAL_ERROR"), error.message
        )
    else:
        kind = _OPENAI_TYPES.get(error.status, "internal_error")
        body = OpenAIErrorBody(_OpenAIError(error.message, kind, error.param, error.code))
    return msgspec.json.encode(body)
