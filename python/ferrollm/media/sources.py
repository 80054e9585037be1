"""A media part's bytes, from wherever its URL points: a data URI, a server-local file, or an
http(s) URL (see `ferrollm.media.fetch`). Each source enforces the part kind's byte cap before
or while reading, never after reading everything.

Local files are the risky source (a client naming ``/etc/shadow``), so they are refused unless
the policy names a root, and then read only when the fully resolved path (``..`` and every
symlink followed) lies inside that root and is a regular file.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ferrollm.media.errors import (
    INVALID_MEDIA,
    MEDIA_PATH_NOT_ALLOWED,
    MEDIA_URL_NOT_ALLOWED,
    UNSUPPORTED_CONTENT_TYPE,
    MediaError,
)
from ferrollm.media.fetch import fetch_url
from ferrollm.media.options import MediaPolicy
from ferrollm.media.parts import MediaPart, too_large

_CHUNK = 1 << 16
_BASE64 = re.compile(rb"[A-Za-z0-9+/\-_]*={0,2}")


def read_media_bytes(part: MediaPart, policy: MediaPolicy) -> bytes:
    """The bytes ``part.url`` points at, within ``policy``; blocking (network, disk).

    Raises MediaError naming the part: ``invalid_media`` (a malformed data URI or URL),
    ``media_too_large``, ``media_path_not_allowed``, ``media_url_not_allowed`` or
    ``media_fetch_failed``.
    """
    cap = policy.limits.max_bytes(part.kind)
    url = part.url
    try:
        split = urlsplit(url)
    except ValueError as error:
        raise MediaError(part.path, INVALID_MEDIA, f"the URL is malformed: {error}") from error
    scheme = split.scheme.lower() if ":" in url else ""
    if url.startswith("/"):
        return read_local(Path(url), part, policy, cap)
    if scheme == "data":
        return decode_data_uri(url, part, cap)
    if scheme == "file":
        if split.netloc not in ("", "localhost"):
            raise MediaError(
                part.path, MEDIA_PATH_NOT_ALLOWED, "a file:// URL must not name a remote host"
            )
        return read_local(Path(unquote(split.path)), part, policy, cap)
    if scheme in ("http", "https"):
        return fetch_url(url, part, policy, cap)
    if scheme:
        raise MediaError(
            part.path,
            MEDIA_URL_NOT_ALLOWED,
            f"URL scheme {scheme!r} is not supported; use http(s), a data URI or a local path",
        )
    raise MediaError(
        part.path,
        INVALID_MEDIA,
        "the location must be a data URI, an http(s) URL, a file:// URL or an absolute "
        "server-local path",
    )


def decode_data_uri(url: str, part: MediaPart, cap: int) -> bytes:
    """The decoded bytes of a ``data:<type>;base64,<data>`` URI.

    Only base64 data URIs are taken (media is binary); the declared type, when given, must be
    of the part's kind (``image/...`` for an image part) or ``application/octet-stream``; the
    bytes themselves decide the format either way. The cap is checked on the encoded
    length first, so an oversized URI is refused without decoding it.
    """
    header, comma, payload = url.partition(",")
    if not comma:
        raise MediaError(part.path, INVALID_MEDIA, "the data URI has no ',' before its data")
    params = [p.strip().lower() for p in header[len("data:") :].split(";")]
    if "base64" not in params[1:]:
        raise MediaError(
            part.path,
            INVALID_MEDIA,
            "the data URI must be base64-encoded ('data:<type>;base64,<data>')",
        )
    mime = params[0]
    if mime and not mime.startswith(f"{part.kind}/") and mime != "application/octet-stream":
        raise MediaError(
            part.path,
            UNSUPPORTED_CONTENT_TYPE,
            f"the data URI's type {mime!r} is not {part.kind}/* as a {part.part_type!r} part needs",
        )
    raw = "".join(payload.split()).encode("ascii", errors="replace")
    if len(raw) // 4 * 3 > cap + 3:
        raise too_large(part, cap)
    if not _BASE64.fullmatch(raw):
        raise MediaError(part.path, INVALID_MEDIA, "the data URI's data is not valid base64")
    try:
        if b"-" in raw or b"_" in raw:
            data = base64.urlsafe_b64decode(raw)
        else:
            data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as error:
        raise MediaError(
            part.path, INVALID_MEDIA, f"the data URI's data is not valid base64: {error}"
        ) from error
    if len(data) > cap:
        raise too_large(part, cap)
    return data


def read_local(path: Path, part: MediaPart, policy: MediaPolicy, cap: int) -> bytes:
    """A server-local file's bytes, when ``policy`` allows local paths and the file resolves
    inside its root. Opening does not follow a symlink swapped in after the check, and a FIFO
    or device is refused without blocking on it."""
    root = policy.allowed_local_media_path
    if root is None:
        raise MediaError(
            part.path,
            MEDIA_PATH_NOT_ALLOWED,
            "server-local media paths are not enabled on this server "
            "(see --allowed-local-media-path)",
        )
    if not path.is_absolute():
        raise MediaError(part.path, MEDIA_PATH_NOT_ALLOWED, "a local path must be absolute")
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        # Says the same as for a path outside the root whether or not the file exists there:
        # the error must not reveal which files exist outside it.
        resolved = None
    if resolved is None or not resolved.is_relative_to(root):
        raise MediaError(
            part.path,
            MEDIA_PATH_NOT_ALLOWED,
            "the path does not name a file inside the server's allowed media directory",
        )
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(resolved, flags)
    except OSError as error:
        raise MediaError(
            part.path, MEDIA_PATH_NOT_ALLOWED, f"the file cannot be opened: {error.strerror}"
        ) from error
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise MediaError(part.path, MEDIA_PATH_NOT_ALLOWED, "the path is not a regular file")
    with os.fdopen(fd, "rb") as file:
        if info.st_size > cap:
            raise too_large(part, cap)
        chunks = []
        size = 0
        while chunk := file.read(_CHUNK):
            size += len(chunk)
            if size > cap:  # the file grew after the fstat
                raise too_large(part, cap)
            chunks.append(chunk)
    return b"".join(chunks)
