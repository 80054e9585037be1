"""Media parts in both shapes, the per-route kinds and counts, and the policy's options."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferrollm.media import MediaError, MediaLimits, MediaPart, MediaPolicy, MediaTimeouts
from ferrollm.media.parts import check_media_count, is_media_part, parse_media_part
from ferrollm.options import EngineConfigError

WHERE = "messages[0].content[1]"


@pytest.mark.parametrize(
    ("part", "kind", "url"),
    [
        ({"type": "image_url", "image_url": "/abs/x.png"}, "image", "/abs/x.png"),
        ({"type": "image_url", "image_url": {"url": "http://h/x.png", "detail": "low"}}, "image",
         "http://h/x.png"),
        ({"type": "video_url", "video_url": {"url": "file:///v.mp4"}}, "video", "file:///v.mp4"),
        ({"type": "audio_url", "audio_url": " data:audio/wav;base64,AA== "}, "audio",
         "data:audio/wav;base64,AA=="),
    ],
)  # fmt: skip
def test_both_shapes_parse_to_the_same_part(part: dict[str, object], kind: str, url: str) -> None:
    parsed = parse_media_part(part, WHERE)
    assert parsed == MediaPart(kind=kind, url=url, path=f"{WHERE}.{part['type']}")
    assert is_media_part(part)


@pytest.mark.parametrize(
    ("part", "param", "code"),
    [
        ({"type": "text", "text": "hi"}, f"{WHERE}.type", "unsupported_content_type"),
        ({"type": "pdf_url", "pdf_url": "/x"}, f"{WHERE}.type", "unsupported_content_type"),
        ({"type": "image_url"}, f"{WHERE}.image_url", "missing"),
        ({"type": "image_url", "image_url": {"detail": "lo"}}, f"{WHERE}.image_url.url", "missing"),
        ({"type": "image_url", "image_url": {"url": 3}}, f"{WHERE}.image_url.url", "wrong_type"),
        ({"type": "image_url", "image_url": 3}, f"{WHERE}.image_url", "wrong_type"),
        ({"type": "audio_url", "audio_url": "  "}, f"{WHERE}.audio_url", "empty"),
    ],
)  # fmt: skip
def test_bad_parts_name_the_member_at_fault(part: dict[str, object], param: str, code: str) -> None:
    with pytest.raises(MediaError) as caught:
        parse_media_part(part, WHERE)
    assert (caught.value.param, caught.value.code, caught.value.status) == (param, code, 400)
    assert caught.value.message.startswith(param)


def test_generate_takes_only_images() -> None:
    generate = MediaLimits.generate()
    assert parse_media_part({"type": "image_url", "image_url": "/x"}, "text_input[1]", generate)
    with pytest.raises(MediaError) as caught:
        parse_media_part({"type": "video_url", "video_url": "/x"}, "text_input[1]", generate)
    assert caught.value.param == "text_input[1].type"
    assert caught.value.code == "unsupported_content_type"
    assert "'image_url'" in caught.value.message


def test_counts_per_route() -> None:
    images = [MediaPart("image", "/x", f"text_input[{i}].image_url") for i in range(2)]
    check_media_count(images[:1], MediaLimits.generate())
    with pytest.raises(MediaError) as caught:
        check_media_count(images, MediaLimits.generate())
    assert (caught.value.param, caught.value.code) == ("text_input[1].image_url", "too_many")
    many = [MediaPart("audio", "/x", f"messages[{i}].content[0].audio_url") for i in range(21)]
    check_media_count(many[:20], MediaLimits.chat())
    with pytest.raises(MediaError) as caught:
        check_media_count(many, MediaLimits.chat())
    assert caught.value.param == "messages[20].content[0].audio_url"


def test_route_limits_match_the_documented_caps() -> None:
    chat, generate = MediaLimits.chat(), MediaLimits.generate()
    assert (chat.max_items, generate.max_items) == (20, 1)
    assert chat.kinds == {"image", "video", "audio"} and generate.kinds == {"image"}
    mib = 2**20
    assert [chat.max_bytes(k) for k in ("image", "video", "audio")] == [
        20 * mib,
        512 * mib,
        20 * mib,
    ]


def test_policy_root_must_be_an_existing_directory(tmp_path: Path) -> None:
    assert MediaPolicy.create().allowed_local_media_path is None
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    assert MediaPolicy.create(str(link)).allowed_local_media_path == tmp_path.resolve()
    file = tmp_path / "f"
    file.write_bytes(b"")
    for bad in (tmp_path / "missing", file, Path("relative/dir")):
        with pytest.raises(EngineConfigError) as caught:
            MediaPolicy.create(bad)
        assert caught.value.field == "allowed_local_media_path"
        assert "allowed_local_media_path" in str(caught.value)


def test_policy_domains_are_normalised_and_checked() -> None:
    policy = MediaPolicy.create(allowed_media_domains="Images.Example.com., [::1] ,10.0.0.5")
    assert policy.allowed_media_domains == {"images.example.com", "::1", "10.0.0.5"}
    assert MediaPolicy.create(allowed_media_domains="").allowed_media_domains == frozenset()
    for bad in ("http://x.com", "a.com,,b.com", "x.com/path", ["ok.com", "user@h"]):
        with pytest.raises(EngineConfigError) as caught:
            MediaPolicy.create(allowed_media_domains=bad)
        assert caught.value.field == "allowed_media_domains"


def test_timeouts_must_be_positive() -> None:
    with pytest.raises(EngineConfigError) as caught:
        MediaTimeouts(read_s=0)
    assert caught.value.field == "media_read_s"
    policy = MediaPolicy.create(limits=MediaLimits.chat()).with_limits(MediaLimits.generate())
    assert policy.limits.max_items == 1


def test_media_errors_are_client_errors() -> None:
    error = MediaError("text_input[1].image_url", "invalid_media", "the image cannot be decoded")
    assert isinstance(error, ValueError) and error.status == 400
    assert str(error) == "text_input[1].image_url: the image cannot be decoded"
