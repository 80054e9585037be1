"""Data URIs and server-local paths: what is read, and every way a bad location is refused."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from media_samples import png

from ferrollm.media import ImageMedia, MediaError, MediaLimits, MediaPart, MediaPolicy
from ferrollm.media.loader import load_media_sync
from ferrollm.media.sources import read_media_bytes

PATH = "messages[0].content[1].image_url"


def image(url: str) -> MediaPart:
    return MediaPart("image", url, PATH)


def refused(part: MediaPart, policy: MediaPolicy, code: str) -> MediaError:
    with pytest.raises(MediaError) as caught:
        read_media_bytes(part, policy)
    assert (caught.value.param, caught.value.code) == (part.path, code)
    return caught.value


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def test_data_uri_decodes_to_the_image() -> None:
    item = load_media_sync(image(data_uri(png(5, 2))), MediaPolicy.create())
    assert isinstance(item, ImageMedia)
    assert (item.width, item.height, item.format, item.image.mode) == (5, 2, "png", "RGB")
    assert item.image.getpixel((4, 1)) == (10, 200, 30)


def test_data_uri_with_line_breaks_and_no_type_is_read() -> None:
    encoded = base64.encodebytes(png()).decode()
    assert "\n" in encoded
    assert read_media_bytes(image(f"data:;base64,{encoded}"), MediaPolicy.create()) == png()


@pytest.mark.parametrize(
    "url",
    ["data:image/png,rawbytes", "data:image/png;charset=utf-8,abc", "data:image/png;base64"],
)
def test_data_uri_that_is_not_base64_is_invalid(url: str) -> None:
    error = refused(image(url), MediaPolicy.create(), "invalid_media")
    assert "base64" in error.message or "','" in error.message


@pytest.mark.parametrize("payload", ["@@@@", "abc", "YWJj=YWJj", "YW Jj!"])
def test_bad_base64_is_invalid(payload: str) -> None:
    error = refused(
        image(f"data:image/png;base64,{payload}"), MediaPolicy.create(), "invalid_media"
    )
    assert "base64" in error.message


def test_data_uri_typed_as_octet_stream_is_read() -> None:
    url = data_uri(png(), "application/octet-stream")
    assert read_media_bytes(image(url), MediaPolicy.create()) == png()


def test_data_uri_of_another_kind_is_refused() -> None:
    error = refused(
        image(data_uri(b"RIFF....WAVE", "audio/wav")),
        MediaPolicy.create(),
        "unsupported_content_type",
    )
    assert "'audio/wav'" in error.message


def test_data_uri_over_the_cap_is_refused_before_decoding() -> None:
    policy = MediaPolicy(
        limits=MediaLimits(max_items=1, kinds=frozenset({"image"}), max_image_bytes=64)
    )
    error = refused(image(data_uri(bytes(65))), policy, "media_too_large")
    assert "image_url" in error.message
    assert read_media_bytes(image(data_uri(bytes(64))), policy) == bytes(64)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[MediaPolicy, Path, Path]:
    """An allowed root holding ok.png, and a sibling directory outside it holding secret.png."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "ok.png").write_bytes(png())
    (outside / "secret.png").write_bytes(png())
    return MediaPolicy.create(allowed_local_media_path=root), root, outside


def test_local_path_inside_the_root_is_read(layout: tuple[MediaPolicy, Path, Path]) -> None:
    policy, root, _ = layout
    assert read_media_bytes(image(str(root / "ok.png")), policy) == png()
    assert read_media_bytes(image(f"file://{root}/ok.png"), policy) == png()
    assert read_media_bytes(image(f"file://localhost{root}/./ok.png"), policy) == png()


def test_local_path_without_a_root_is_refused(layout: tuple[MediaPolicy, Path, Path]) -> None:
    _, root, _ = layout
    error = refused(image(str(root / "ok.png")), MediaPolicy.create(), "media_path_not_allowed")
    assert "--allowed-local-media-path" in error.message
    refused(image(f"file://{root}/ok.png"), MediaPolicy.create(), "media_path_not_allowed")


def test_paths_that_leave_the_root_are_refused(layout: tuple[MediaPolicy, Path, Path]) -> None:
    policy, root, outside = layout
    (root / "link.png").symlink_to(outside / "secret.png")
    (root / "dirlink").symlink_to(outside)
    for url in (
        str(outside / "secret.png"),
        f"{root}/../outside/secret.png",
        f"file://{root}/../outside/secret.png",
        str(root / "link.png"),
        str(root / "dirlink" / "secret.png"),
        str(root / "missing.png"),
        "/etc/passwd",
    ):
        error = refused(image(url), policy, "media_path_not_allowed")
        assert "allowed media directory" in error.message, url


def test_a_symlink_that_stays_inside_the_root_is_followed(
    layout: tuple[MediaPolicy, Path, Path],
) -> None:
    policy, root, _ = layout
    (root / "alias.png").symlink_to(root / "ok.png")
    assert read_media_bytes(image(str(root / "alias.png")), policy) == png()


def test_a_fifo_or_directory_is_refused_without_blocking(
    layout: tuple[MediaPolicy, Path, Path],
) -> None:
    policy, root, _ = layout
    os.mkfifo(root / "pipe.png")
    (root / "dir.png").mkdir()
    for name in ("pipe.png", "dir.png"):
        refused(image(str(root / name)), policy, "media_path_not_allowed")


def test_a_file_over_the_cap_is_refused(layout: tuple[MediaPolicy, Path, Path]) -> None:
    policy, root, _ = layout
    small = policy.with_limits(
        MediaLimits(max_items=1, kinds=frozenset({"image"}), max_image_bytes=10)
    )
    refused(image(str(root / "ok.png")), small, "media_too_large")


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("relative/x.png", "invalid_media"),
        ("ftp://host/x.png", "media_url_not_allowed"),
        ("file://otherhost/x.png", "media_path_not_allowed"),
    ],
)
def test_other_locations_are_refused(url: str, code: str) -> None:
    refused(image(url), MediaPolicy.create(), code)
