"""`Route`: one row of the server's routing table (``app.ROUTES``), which the app matches
requests against and `openapi` documents."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ferrollm.server.context import ServerContext
    from ferrollm.server.http import Request, Response

Handler = Callable[["ServerContext", "Request"], Awaitable["Response"]]


@dataclass(frozen=True)
class Route:
    """One row of the routing table; ``request``/``response`` (a Struct type, or a tuple of
    alternatives) document it in OpenAPI, and ``stream`` the events of its SSE response (the
    data of each event; None: the route does not stream)."""

    method: str
    path: str
    handler: Handler
    summary: str
    request: Any = None
    response: Any = None
    stream: Any = None

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.path) + "$")
