"""The web playground: a static page (HTML, three ES modules, one stylesheet) served at ``/``
that talks to the server's own ``/v1`` routes (docs/serving.md#the-playground).

The page and its assets are public (no API key: they hold nothing but code); every API call
the page makes carries the key the user types. ``--no-playground`` turns it off (404).
Nothing is fetched from elsewhere: no CDN, no web fonts.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from ferrollm.server_config import ServerConfig

#: URL path -> (file in this package, content type).
ASSETS: dict[str, tuple[str, str]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/playground/playground.js": ("playground.js", "text/javascript; charset=utf-8"),
    "/playground/stream.js": ("stream.js", "text/javascript; charset=utf-8"),
    "/playground/transcript.js": ("transcript.js", "text/javascript; charset=utf-8"),
    "/playground/playground.css": ("playground.css", "text/css; charset=utf-8"),
}

#: What the page's responses say about themselves: no framing by other sites, no script or
#: style from anywhere but this server (the page must work offline).
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data: blob:; media-src 'self' data: blob:; "
        b"frame-ancestors 'none'",
    ),
    (b"cache-control", b"no-cache"),
)


def open_paths(config: ServerConfig) -> frozenset[str]:
    """The paths served without an API key: the configured public paths, and the
    playground's page and assets while it is on."""
    paths = set(config.public_paths)
    if config.playground:
        paths.update(ASSETS)
    return frozenset(paths)


@cache
def asset(path: str) -> tuple[bytes, str] | None:
    """The bytes and content type of the playground file at URL ``path``; None for any
    other path."""
    entry = ASSETS.get(path)
    if entry is None:
        return None
    name, content_type = entry
    return resources.files(__name__).joinpath(name).read_bytes(), content_type
