"""Fetching an http(s) media URL without letting a client aim the server at its own network.

Every hop (the URL and each redirect, at most five) is checked before any connection: the
scheme must be http or https and never drop from https to http; the host must be on the
policy's allow-list when it has one; and a host that is not on the list must resolve only to
public addresses (no loopback, private, link-local, shared, multicast or reserved ones). The
connection then goes to an address that was checked, not to a second lookup that DNS could
answer differently. The byte cap is enforced from ``Content-Length`` and again while the body
streams in, and every read has the read timeout and the remainder of the total one.

Built on http.client: no environment proxy is consulted, no cookies or credentials are sent.
Name resolution uses the system resolver, whose own timeout applies.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable
from urllib.parse import quote, urljoin, urlsplit

from ferrollm.media.errors import (
    INVALID_MEDIA,
    MEDIA_FETCH_FAILED,
    MEDIA_URL_NOT_ALLOWED,
    MediaError,
)
from ferrollm.media.options import MediaPolicy, normalize_host
from ferrollm.media.parts import MediaPart, too_large

MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 1 << 16
_SCHEME_RANK = {"http": 0, "https": 1}
_PATH_SAFE = "!$%&'()*+,-./:;=?@_~"

#: (host, port) -> the addresses it resolves to; replaceable in tests.
Resolver = Callable[[str, int], list[str]]


def tls_context() -> ssl.SSLContext:
    """The TLS settings of https fetches: the system's trusted CAs, host names checked.
    Looked up at each fetch, so a test can trust its own certificate."""
    return ssl.create_default_context()


def system_resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in seen:
            seen.append(address)
    return seen


def fetch_url(
    url: str,
    part: MediaPart,
    policy: MediaPolicy,
    cap: int,
    resolve: Resolver = system_resolve,
) -> bytes:
    """The body of ``url`` (following redirects) within ``policy`` and ``cap`` bytes.

    Raises MediaError naming the part: ``media_url_not_allowed`` for a hop the policy refuses
    (raised before connecting to it), ``media_too_large``, ``invalid_media`` for a malformed
    URL, ``media_fetch_failed`` for anything the network or the remote server did.
    """
    timeouts = policy.timeouts
    deadline = time.monotonic() + timeouts.total_s
    current = url
    previous_scheme: str | None = None
    for hop in range(MAX_REDIRECTS + 1):
        where = "the URL" if hop == 0 else f"redirect {hop} ({_shown(current)})"
        try:
            split = urlsplit(current)
        except ValueError as error:
            raise MediaError(part.path, INVALID_MEDIA, f"{where} is malformed: {error}") from error
        scheme = split.scheme.lower()
        if scheme not in _SCHEME_RANK:
            raise MediaError(
                part.path,
                MEDIA_URL_NOT_ALLOWED,
                f"{where} has scheme {scheme or 'none'!r}; only http and https are fetched",
            )
        if previous_scheme is not None and _SCHEME_RANK[scheme] < _SCHEME_RANK[previous_scheme]:
            raise MediaError(
                part.path,
                MEDIA_URL_NOT_ALLOWED,
                f"{where} goes from https to http, which is refused",
            )
        host = split.hostname
        try:
            port = split.port or (443 if scheme == "https" else 80)
        except ValueError as error:
            raise MediaError(part.path, INVALID_MEDIA, f"{where} has a bad port") from error
        if not host:
            raise MediaError(part.path, INVALID_MEDIA, f"{where} names no host")
        addresses = _allowed_addresses(host, port, where, part, policy, resolve)
        # Spaces and non-ASCII characters are escaped (http.client sends only ASCII); escapes
        # already there are kept.
        target = quote(split.path or "/", safe=_PATH_SAFE)
        if split.query:
            target += "?" + quote(split.query, safe=_PATH_SAFE)
        connection = _connect(scheme, host, port, addresses, policy, deadline, where, part)
        response: http.client.HTTPResponse | None = None
        try:
            response = _request(connection, target, deadline, timeouts.read_s, where, part)
            if response.status in _REDIRECTS:
                location = response.getheader("Location")
                if not location:
                    raise MediaError(
                        part.path,
                        MEDIA_FETCH_FAILED,
                        f"{where} answered {response.status} without a Location",
                    )
                previous_scheme = scheme
                current = urljoin(current, location.strip())
                continue
            if response.status != 200:
                raise MediaError(
                    part.path,
                    MEDIA_FETCH_FAILED,
                    f"{where} answered HTTP {response.status} {response.reason}".rstrip(),
                )
            return _read_body(connection, response, cap, deadline, timeouts.read_s, where, part)
        finally:
            # The response holds its own reference to the socket: without closing it too, an
            # aborted download would keep the connection open until garbage collection.
            if response is not None:
                response.close()
            connection.close()
    raise MediaError(
        part.path, MEDIA_FETCH_FAILED, f"the URL redirected more than {MAX_REDIRECTS} times"
    )


def refused_address(address: str) -> str | None:
    """Why ``address`` may not be fetched from without an allow-list entry, or None when it is
    a public unicast address."""
    ip = ipaddress.ip_address(address.partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_unspecified or ip.is_reserved:
        return "reserved"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "non-public"
    return None


def _allowed_addresses(
    host: str, port: int, where: str, part: MediaPart, policy: MediaPolicy, resolve: Resolver
) -> list[str]:
    name = normalize_host(host)
    listed = name in policy.allowed_media_domains
    try:
        addresses = resolve(name, port)
    except (OSError, UnicodeError) as error:
        raise MediaError(
            part.path, MEDIA_FETCH_FAILED, f"{where}: host {name!r} does not resolve"
        ) from error
    if not addresses:
        raise MediaError(part.path, MEDIA_FETCH_FAILED, f"{where}: host {name!r} has no address")
    if not listed:
        for address in addresses:
            why = refused_address(address)
            if why is not None:
                # The address itself is named only when the URL wrote it: a client must not
                # learn what the server's DNS says about internal names.
                what = (
                    f"is the {why} address" if address == name else f"resolves to a {why} address"
                )
                raise MediaError(
                    part.path,
                    MEDIA_URL_NOT_ALLOWED,
                    f"{where}: host {name!r} {what}, which media URLs may not reach unless "
                    "the host is in --allowed-media-domains",
                )
        if policy.allowed_media_domains:
            raise MediaError(
                part.path,
                MEDIA_URL_NOT_ALLOWED,
                f"{where}: host {name!r} is not in the server's --allowed-media-domains",
            )
    return addresses


def _connect(
    scheme: str,
    host: str,
    port: int,
    addresses: list[str],
    policy: MediaPolicy,
    deadline: float,
    where: str,
    part: MediaPart,
) -> http.client.HTTPConnection:
    timeouts = policy.timeouts

    def pinned(
        _address: tuple[str, int], _timeout: float | None, source: tuple[str, int] | None = None
    ) -> socket.socket:
        # http.client asks for (host, port); connect to a checked address of it instead.
        error: OSError | None = None
        for address in addresses:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                sock = socket.create_connection(
                    (address, port), min(timeouts.connect_s, remaining), source
                )
            except OSError as failure:
                error = failure
                continue
            sock.settimeout(min(timeouts.read_s, max(deadline - time.monotonic(), 0.001)))
            return sock
        raise error or TimeoutError("the total fetch timeout passed")

    connection: http.client.HTTPConnection
    if scheme == "https":
        connection = http.client.HTTPSConnection(
            host, port, timeout=timeouts.connect_s, context=tls_context()
        )
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeouts.connect_s)
    connection._create_connection = pinned  # type: ignore[attr-defined]
    try:
        connection.connect()
    except (OSError, http.client.HTTPException) as error:
        connection.close()
        raise MediaError(
            part.path, MEDIA_FETCH_FAILED, f"{where}: cannot connect: {_describe(error)}"
        ) from error
    return connection


def _request(
    connection: http.client.HTTPConnection,
    target: str,
    deadline: float,
    read_s: float,
    where: str,
    part: MediaPart,
) -> http.client.HTTPResponse:
    try:
        connection.putrequest("GET", target, skip_accept_encoding=True)
        connection.putheader("Accept", "*/*")
        connection.putheader("Accept-Encoding", "identity")
        connection.putheader("User-Agent", "ferrollm-media")
        connection.endheaders()
        _arm(connection, deadline, read_s)
        return connection.getresponse()
    except (OSError, ValueError, http.client.HTTPException) as error:
        raise MediaError(
            part.path, MEDIA_FETCH_FAILED, f"{where}: no response: {_describe(error)}"
        ) from error


def _read_body(
    connection: http.client.HTTPConnection,
    response: http.client.HTTPResponse,
    cap: int,
    deadline: float,
    read_s: float,
    where: str,
    part: MediaPart,
) -> bytes:
    declared = response.getheader("Content-Length")
    if declared is not None and declared.strip().isdigit() and int(declared) > cap:
        raise too_large(part, cap)
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            _arm(connection, deadline, read_s)
            chunk = response.read1(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > cap:
                raise too_large(part, cap)
            chunks.append(chunk)
    except (OSError, http.client.HTTPException) as error:
        raise MediaError(
            part.path, MEDIA_FETCH_FAILED, f"{where}: the download failed: {_describe(error)}"
        ) from error
    return b"".join(chunks)


def _arm(connection: http.client.HTTPConnection, deadline: float, read_s: float) -> None:
    """Gives the next socket operation the read timeout or what is left of the total one."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("the total fetch timeout passed")
    if connection.sock is not None:
        connection.sock.settimeout(min(read_s, remaining))


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return f"timed out ({error})" if str(error) else "timed out"
    return str(error) or type(error).__name__


def _shown(url: str) -> str:
    """A URL short enough for an error message."""
    return url if len(url) <= 120 else url[:117] + "..."
