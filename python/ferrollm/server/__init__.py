"""The HTTP server: a raw ASGI app (msgspec bodies) served by Granian.

OpenAI-compatible ``/v1`` routes with MindIE's extensions, MindIE's ``/v2/models/{model}/
generate[_stream]``, the Databricks ``/serving-endpoints/{name}/invocations``, health,
``/metrics`` and ``/openapi.json``. ``ferrollm serve`` (``ferrollm.cli``) starts it.
"""
