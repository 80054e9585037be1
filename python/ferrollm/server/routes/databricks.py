"""Databricks ``POST /serving-endpoints/{name}/invocations`` (SPEC 6): the task comes from the
body's shape (``messages``: chat, ``prompt``: completions, ``input``: embeddings, →A-64)."""

from __future__ import annotations

from ferrollm.server.context import ServerContext
from ferrollm.server.errors import ApiError, bad_request
from ferrollm.server.http import Request, Response
from ferrollm.server.routes import chat, completions, embeddings
from ferrollm.server.routes.common import read_json

_TASK_KEYS = ("messages", "prompt", "input")


async def invocations(ctx: ServerContext, request: Request) -> Response:
    """Dispatch to the chat, completions or embeddings task."""
    name = request.path_params["name"]
    if ctx.config.strict_model_name and name != ctx.model_name:
        raise ApiError(
            404,
            f"serving endpoint {name!r} does not exist; this server serves {ctx.model_name!r}",
            param="name",
            code="RESOURCE_DOES_NOT_EXIST",
        )
    body = await read_json(request)
    keys = [key for key in _TASK_KEYS if body.get(key) is not None]
    if len(keys) != 1:
        found = ", ".join(f"`{k}`" for k in keys) or "none"
        raise bad_request(
            "the body must have exactly one of `messages` (chat), `prompt` (completions) or "
            f"`input` (embeddings); found {found}",
            code="invalid_value",
        )
    if keys[0] == "messages":
        return await chat.serve_chat(ctx, request, body, chat.DATABRICKS)
    if keys[0] == "prompt":
        return await completions.serve_completions(ctx, request, body, databricks=True)
    return await embeddings.databricks_embeddings(ctx, request, body)
