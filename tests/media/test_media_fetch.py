"""http(s) media URLs: the address policy before every hop, redirects, timeouts and the byte
cap while streaming, against an http.server this module starts on 127.0.0.1."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import pytest
from media_http import MediaServer, endless, redirect, send, slow
from media_samples import png

from ferrollm.media import ImageMedia, MediaError, MediaLimits, MediaPart, MediaPolicy, fetch
from ferrollm.media.fetch import fetch_url, refused_address
from ferrollm.media.loader import load_media_sync
from ferrollm.media.options import MediaTimeouts
from ferrollm.media.sources import read_media_bytes

PATH = "messages[0].content[0].image_url"
#: Loopback allowed by name: the test server stands in for an allowed in-cluster host.
LOCAL = MediaPolicy.create(
    allowed_media_domains="localhost",
    timeouts=MediaTimeouts(connect_s=2, read_s=0.3, total_s=5),
)


def image(url: str) -> MediaPart:
    return MediaPart("image", url, PATH)


def refused(url: str, policy: MediaPolicy, code: str) -> MediaError:
    with pytest.raises(MediaError) as caught:
        read_media_bytes(image(url), policy)
    assert (caught.value.param, caught.value.code) == (PATH, code)
    return caught.value


def serve_png(server: MediaServer) -> None:
    server.routes["/x.png"] = lambda handler, _: send(handler, png(7, 5))


def test_loopback_is_refused_without_connecting(media_server: MediaServer) -> None:
    serve_png(media_server)
    error = refused(media_server.url("/x.png"), MediaPolicy.create(), "media_url_not_allowed")
    assert "host '127.0.0.1' is the loopback address" in error.message
    # Listing another host does not open loopback to every host.
    refused(media_server.url("/x.png"), LOCAL, "media_url_not_allowed")
    error = refused(media_server.url("/x.png", "localhost"), MediaPolicy(), "media_url_not_allowed")
    assert "'localhost' resolves to a loopback address" in error.message
    assert media_server.requests == []


def test_an_allowed_loopback_host_is_fetched(media_server: MediaServer) -> None:
    serve_png(media_server)
    item = load_media_sync(image(media_server.url("/x.png", "localhost")), LOCAL)
    assert isinstance(item, ImageMedia) and (item.width, item.height) == (7, 5)
    assert media_server.requests == ["/x.png"]


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("100.64.0.1", "non-public"),
        ("0.0.0.0", "reserved"),
        ("240.0.0.1", "reserved"),
        ("224.0.0.1", "multicast"),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_address_rules(address: str, why: str | None) -> None:
    assert refused_address(address) == why


def test_public_host_not_on_the_list_is_refused_before_connecting() -> None:
    connected: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        connected.append(host)
        return ["93.184.216.34"]

    policy = MediaPolicy.create(allowed_media_domains="images.example.com")
    with pytest.raises(MediaError) as caught:
        fetch_url("http://Other.Example.com/x.png", image("u"), policy, 100, resolve)
    assert caught.value.code == "media_url_not_allowed"
    assert "'other.example.com' is not in the server's --allowed-media-domains" in str(caught.value)
    assert connected == ["other.example.com"]


def test_a_host_with_any_private_address_is_refused() -> None:
    with pytest.raises(MediaError) as caught:
        fetch_url(
            "https://mixed.test/x.png",
            image("u"),
            MediaPolicy.create(),
            100,
            lambda host, port: ["93.184.216.34", "10.0.0.7"],
        )
    assert caught.value.code == "media_url_not_allowed"
    # The address is not named: a client must not learn what internal names resolve to.
    assert "'mixed.test' resolves to a private address" in str(caught.value)
    assert "10.0.0.7" not in str(caught.value)


def test_a_redirect_is_followed_and_rechecked(media_server: MediaServer) -> None:
    serve_png(media_server)
    media_server.routes["/hop"] = redirect("/x.png")
    assert read_media_bytes(image(media_server.url("/hop", "localhost")), LOCAL) == png(7, 5)
    assert media_server.requests == ["/hop", "/x.png"]


def test_a_redirect_to_a_private_address_is_refused(media_server: MediaServer) -> None:
    serve_png(media_server)
    media_server.routes["/hop"] = redirect("http://127.0.0.1:{port}/x.png")
    error = refused(media_server.url("/hop", "localhost"), LOCAL, "media_url_not_allowed")
    assert "redirect 1" in error.message and "'127.0.0.1' is the loopback address" in error.message
    assert media_server.requests == ["/hop"]


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://localhost/x.png", "data:,x"])
def test_a_redirect_off_http_is_refused(media_server: MediaServer, location: str) -> None:
    media_server.routes["/hop"] = redirect(location)
    error = refused(media_server.url("/hop", "localhost"), LOCAL, "media_url_not_allowed")
    assert "only http and https" in error.message
    assert media_server.requests == ["/hop"]


def test_redirects_stop_after_five(media_server: MediaServer) -> None:
    media_server.routes["/loop"] = redirect("/loop")
    error = refused(media_server.url("/loop", "localhost"), LOCAL, "media_fetch_failed")
    assert "more than 5 times" in error.message
    assert len(media_server.requests) == 6


def test_paths_are_escaped_and_bad_urls_refused(media_server: MediaServer) -> None:
    media_server.routes["/a%20b/%C3%A9.png?q=%C3%A9%20x"] = lambda h, _: send(h, png())
    url = media_server.url("/a b/é.png?q=é x", "localhost")
    assert read_media_bytes(image(url), LOCAL) == png()
    refused("http://[::1/x.png", LOCAL, "invalid_media")
    refused("http://localhost:99999/x.png", LOCAL, "invalid_media")
    refused("http:///x.png", LOCAL, "invalid_media")


def test_http_errors_and_refused_connections_fail(media_server: MediaServer) -> None:
    error = refused(media_server.url("/missing", "localhost"), LOCAL, "media_fetch_failed")
    assert "HTTP 404" in error.message
    refused("http://localhost:1/x.png", LOCAL, "media_fetch_failed")


def test_a_slow_server_hits_the_read_timeout(media_server: MediaServer) -> None:
    media_server.routes["/slow"] = slow(1.5)
    start = time.monotonic()
    error = refused(media_server.url("/slow", "localhost"), LOCAL, "media_fetch_failed")
    assert "timed out" in error.message
    assert time.monotonic() - start < 1.2


def test_a_declared_length_over_the_cap_is_refused_unread(media_server: MediaServer) -> None:
    def liar(handler: object, _: MediaServer) -> None:
        handler.send_response(200)  # type: ignore[attr-defined]
        handler.send_header("Content-Length", str(21 * 2**20))  # type: ignore[attr-defined]
        handler.end_headers()  # type: ignore[attr-defined]
        handler.wfile.write(png())  # type: ignore[attr-defined]

    media_server.routes["/big"] = liar
    error = refused(media_server.url("/big", "localhost"), LOCAL, "media_too_large")
    assert "20 MiB" in error.message


def test_a_body_over_the_cap_is_aborted_while_streaming(media_server: MediaServer) -> None:
    media_server.routes["/endless"] = endless(limit=256 * 2**20)
    small = LOCAL.with_limits(
        MediaLimits(max_items=1, kinds=frozenset({"image"}), max_image_bytes=2**20)
    )
    refused(media_server.url("/endless", "localhost"), small, "media_too_large")
    assert media_server.stream_done.wait(5)
    # The client hung up soon after 1 MiB (what it sent on top sat in socket buffers);
    # without the cap it would have read all 256.
    assert media_server.streamed < 64 * 2**20


def trust(monkeypatch: pytest.MonkeyPatch, cert: Path) -> None:
    monkeypatch.setattr(fetch, "tls_context", lambda: ssl.create_default_context(cafile=cert))


def test_https_is_fetched_with_the_host_name_checked(
    tls_media_server: tuple[MediaServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, cert = tls_media_server
    serve_png(server)
    trust(monkeypatch, cert)
    url = server.url("/x.png", "localhost", "https")
    assert read_media_bytes(image(url), LOCAL) == png(7, 5)
    # The certificate names localhost, not 127.0.0.1: the connection goes to a checked
    # address, but TLS still verifies the name the URL gave.
    numeric = MediaPolicy.create(allowed_media_domains="127.0.0.1", timeouts=LOCAL.timeouts)
    error = refused(server.url("/x.png", "127.0.0.1", "https"), numeric, "media_fetch_failed")
    assert "certificate" in error.message.lower()
    assert server.requests == ["/x.png"]


def test_an_https_certificate_not_trusted_fails(
    tls_media_server: tuple[MediaServer, Path],
) -> None:
    server, _ = tls_media_server
    serve_png(server)
    error = refused(server.url("/x.png", "localhost", "https"), LOCAL, "media_fetch_failed")
    assert "certificate" in error.message.lower()
    assert server.requests == []


def test_a_redirect_from_https_to_http_is_refused(
    tls_media_server: tuple[MediaServer, Path],
    media_server: MediaServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, cert = tls_media_server
    trust(monkeypatch, cert)
    serve_png(media_server)
    server.routes["/down"] = redirect(media_server.url("/x.png", "localhost"))
    error = refused(server.url("/down", "localhost", "https"), LOCAL, "media_url_not_allowed")
    assert "from https to http" in error.message
    assert server.requests == ["/down"] and media_server.requests == []
