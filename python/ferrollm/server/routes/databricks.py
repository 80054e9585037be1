"""Databricks ``POST /serving-endpoints/{name}/invocations`` (docs/api/databricks.md): the task
comes from the body's shape (``messages``: chat, ``prompt``: completions, ``input``: embeddings,
docs/decisions.md#choosing-the-task), read by the validator in the body's one walk."""

from __future__ import annotations

from ferrollm.server.context import ServerContext
from ferrollm.server.http import Request, Response
from ferrollm.server.render import DatabricksRenderer
from ferrollm.server.routes import chat, completions, embeddings
from ferrollm.server.routes.common import accept


async def invocations(ctx: ServerContext, request: Request) -> Response:
    """Dispatch to the chat, completions or embeddings task."""
    name = request.path_params["name"]
    lora = ctx.select_model(name, "name", "serving endpoint", "RESOURCE_DOES_NOT_EXIST")
    valid = await accept(ctx, "databricks", request)
    render = DatabricksRenderer(ctx, truncate=valid.truncate, lora=lora)
    if valid.route == "databricks_chat":
        return await chat.serve_chat(ctx, request, valid, render)
    if valid.route == "databricks_completions":
        return await completions.serve_completions(ctx, request, valid, render)
    return await embeddings.databricks_embeddings(ctx, valid)
