"""``GET /openapi.json``: an OpenAPI 3.1 document generated from the routing table and the
msgspec Structs each route decodes and encodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ferrollm import __version__
from ferrollm.server.errors import DatabricksErrorBody, MindIEErrorBody, OpenAIErrorBody

if TYPE_CHECKING:
    from ferrollm.server.routing import Route

_REF = "#/components/schemas/{name}"


def openapi_document(routes: Sequence[Route]) -> bytes:
    """The encoded document for ``routes``."""
    types: list[Any] = [OpenAIErrorBody, MindIEErrorBody, DatabricksErrorBody]
    for route in routes:
        for t in (route.request, route.response):
            types += t if isinstance(t, tuple) else [t] if t is not None else []
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    by_type = dict(zip(types, schemas, strict=True))

    def schema(t: Any) -> dict[str, Any]:
        return {"oneOf": [by_type[x] for x in t]} if isinstance(t, tuple) else by_type[t]

    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation: dict[str, Any] = {"summary": route.summary, "responses": {}}
        if route.request is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema(route.request)}},
            }
        ok: dict[str, Any] = {"description": "OK"}
        if route.response is not None:
            media = "text/event-stream" if route.path.endswith("_stream") else "application/json"
            ok["content"] = {media: {"schema": schema(route.response)}}
        operation["responses"]["200"] = ok
        operation["responses"]["4XX"] = {
            "description": "Bad request (the error body of the route's API, SPEC 1.14)",
            "content": {"application/json": {"schema": by_type[_error_type(route.path)]}},
        }
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    document = {
        "openapi": "3.1.0",
        "info": {"title": "ferrollm", "version": __version__},
        "paths": paths,
        "components": {"schemas": components},
    }
    return msgspec.json.encode(document)


def _error_type(path: str) -> Any:
    if path.startswith("/v2/"):
        return MindIEErrorBody
    if path.startswith("/serving-endpoints/"):
        return DatabricksErrorBody
    return OpenAIErrorBody
