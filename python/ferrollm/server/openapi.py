"""``GET /openapi.json``: an OpenAPI 3.1 document generated from the routing table and the
msgspec Structs each route decodes and encodes."""

from __future__ import annotations

import re
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
        for t in (route.request, route.response, route.stream):
            types += t if isinstance(t, tuple) else [t] if t is not None else []
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    by_type = dict(zip(types, schemas, strict=True))

    def schema(t: Any) -> dict[str, Any]:
        return {"oneOf": [by_type[x] for x in t]} if isinstance(t, tuple) else by_type[t]

    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation: dict[str, Any] = {"summary": route.summary, "responses": {}}
        names = re.findall(r"\{(\w+)\}", route.path)
        if names:
            operation["parameters"] = [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                for name in names
            ]
        if route.request is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema(route.request)}},
            }
        ok: dict[str, Any] = {"description": "OK", "content": {}}
        if route.response is not None:
            ok["content"]["application/json"] = {"schema": schema(route.response)}
        if route.stream is not None:
            data = _inline(schema(route.stream), components)
            ok["content"]["text/event-stream"] = {"schema": _event(data)}
        if not ok["content"]:
            del ok["content"]
        operation["responses"]["200"] = ok
        operation["responses"]["4XX"] = {
            "description": "Bad request (its API's error body: docs/api/common.md#error-bodies)",
            "content": {"application/json": {"schema": by_type[_error_type(route.path)]}},
        }
        error = {"application/json": {"schema": by_type[_error_type(route.path)]}}
        unavailable: dict[str, Any] = {
            "description": "Overloaded, draining or not ready (docs/api/common.md#status-codes)",
            "headers": {"Retry-After": {"schema": {"type": "string"}}},
        }
        operation["responses"]["503"] = unavailable
        if route.request is not None:
            unavailable["content"] = error
            operation["responses"]["504"] = {
                "description": "The request's deadline passed before its response began",
                "content": error,
            }
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    document = {
        "openapi": "3.1.0",
        "info": {"title": "ferrollm", "version": __version__},
        "paths": paths,
        "components": {"schemas": components},
    }
    return msgspec.json.encode(document)


def _event(data: dict[str, Any]) -> dict[str, Any]:
    """One SSE event (the schema of a ``text/event-stream`` before OpenAPI 3.2): its ``data``
    is one line of JSON of schema ``data``, or the ``[DONE]`` sentinel of the OpenAI-style
    routes."""
    json_data = {"type": "string", "contentMediaType": "application/json", "contentSchema": data}
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"anyOf": [{"const": "[DONE]"}, json_data]}},
    }


def _inline(schema: Any, components: dict[str, Any]) -> Any:
    """``schema`` with every ``$ref`` replaced by its component (the Structs are not
    recursive): a ``contentSchema`` is checked as a document of its own, where references to
    the enclosing document's components do not resolve."""
    if isinstance(schema, list):
        return [_inline(item, components) for item in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        return _inline(components[ref.rsplit("/", 1)[1]], components)
    return {key: _inline(value, components) for key, value in schema.items()}


def _error_type(path: str) -> Any:
    if path.startswith("/v2/"):
        return MindIEErrorBody
    if path.startswith("/serving-endpoints/"):
        return DatabricksErrorBody
    return OpenAIErrorBody
