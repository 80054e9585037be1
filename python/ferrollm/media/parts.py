"""A request's media part, read into `MediaPart`: which kind, where it points, and where in
the request it sits (for errors).

Both shapes are accepted: MindIE's bare string ``{"type": "image_url", "image_url": "/x.png"}``
and OpenAI's object ``{"type": "image_url", "image_url": {"url": "..."}}`` (other members of
the object, such as OpenAI's ``detail``, are ignored). The request validator has already
checked the shape and the counts of a route's body; this module repeats those checks so it
can be used on its own (offline requests, tests) and raises `MediaError` with the same codes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ferrollm.media.errors import (
    EMPTY,
    MEDIA_TOO_LARGE,
    MISSING,
    TOO_MANY,
    UNSUPPORTED_CONTENT_TYPE,
    WRONG_TYPE,
    MediaError,
)
from ferrollm.media.options import AUDIO, IMAGE, VIDEO, MediaLimits

#: Part type -> media kind.
PART_KINDS = {"image_url": IMAGE, "video_url": VIDEO, "audio_url": AUDIO}


@dataclass(frozen=True)
class MediaPart:
    """One media part: ``kind`` is "image", "video" or "audio", ``url`` the location as
    written (data URI, http(s) URL, ``file://`` URL or server-local path), and ``path`` the
    part's value in the request (``messages[0].content[1].image_url``), which every error
    about this part names."""

    kind: str
    url: str
    path: str

    @property
    def part_type(self) -> str:
        """The part's ``type`` ("image_url", ...)."""
        return f"{self.kind}_url"


def is_media_part(part: object) -> bool:
    """Whether ``part`` is a content part whose type is a media type."""
    return isinstance(part, Mapping) and part.get("type") in PART_KINDS


def parse_media_part(
    part: Mapping[str, object], where: str, limits: MediaLimits | None = None
) -> MediaPart:
    """The `MediaPart` of the content part at ``where`` (``messages[0].content[1]``).

    Raises MediaError: ``unsupported_content_type`` when the type is not a media type or not
    one ``limits`` takes, ``missing``/``wrong_type``/``empty`` for a bad location.
    """
    part_type = part.get("type")
    kind = PART_KINDS.get(part_type) if isinstance(part_type, str) else None
    if kind is None:
        raise MediaError(
            f"{where}.type",
            UNSUPPORTED_CONTENT_TYPE,
            f"type {part_type!r} is not a media part type; expected one of "
            + ", ".join(repr(t) for t in PART_KINDS),
        )
    if limits is not None and kind not in limits.kinds:
        raise MediaError(
            f"{where}.type",
            UNSUPPORTED_CONTENT_TYPE,
            f"type {part_type!r} is not supported on this route; it takes "
            + ", ".join(f"'{k}_url'" for k in sorted(limits.kinds)),
        )
    assert isinstance(part_type, str)
    path = f"{where}.{part_type}"
    value = part.get(part_type)
    if value is None:
        raise MediaError(path, MISSING, f"a {part_type!r} part needs its {part_type!r} member")
    if isinstance(value, Mapping):
        url = value.get("url")
        if url is None:
            raise MediaError(f"{path}.url", MISSING, "the object form needs a `url` member")
        if not isinstance(url, str):
            raise MediaError(f"{path}.url", WRONG_TYPE, "`url` must be a string")
    elif isinstance(value, str):
        url = value
    else:
        raise MediaError(path, WRONG_TYPE, "must be a string or an object with `url`")
    if not url.strip():
        raise MediaError(path, EMPTY, "the media location must not be empty")
    return MediaPart(kind=kind, url=url.strip(), path=path)


def check_media_count(parts: Iterable[MediaPart], limits: MediaLimits) -> None:
    """Raises MediaError ``too_many`` on the first part past ``limits.max_items`` (a request's
    parts taken together, in order)."""
    for count, part in enumerate(parts, start=1):
        if count > limits.max_items:
            noun = "image" if limits.kinds == {IMAGE} else "media"
            raise MediaError(
                part.path,
                TOO_MANY,
                f"is over the limit of {limits.max_items} {noun} part(s) per request",
            )


def too_large(part: MediaPart, cap: int) -> MediaError:
    """The error for a part whose bytes pass ``cap``."""
    return MediaError(
        part.path,
        MEDIA_TOO_LARGE,
        f"the {part.kind} is larger than the {cap / 2**20:g} MiB a {part.part_type!r} part "
        "may have",
    )
