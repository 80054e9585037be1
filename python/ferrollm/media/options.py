"""What a server allows media parts to be and do: where they may come from, how long a fetch
may take, and how big each kind may get. Torch-free and import-light, so the CLI can build and
check it before anything heavy loads.

The command-line flags that fill `MediaPolicy` (vLLM's names):

``--allowed-local-media-path DIR``
    Server-local paths (``/data/x.png``, ``file:///data/x.png``) are refused unless this is
    set, and then only files inside ``DIR`` (after resolving ``..`` and symlinks) are read.
``--allowed-media-domains HOST[,HOST...]``
    Empty (the default): any http(s) host whose addresses are all public may be fetched.
    Given: only these hosts may be fetched, and they are trusted even when they resolve to
    loopback or private addresses (an in-cluster image store, say). Matching is exact and
    case-insensitive on the host name (or IP literal) as the URL writes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ferrollm.options import EngineConfigError

MiB = 2**20

#: Media kinds by the part type that carries them.
IMAGE = "image"
VIDEO = "video"
AUDIO = "audio"
KINDS = (IMAGE, VIDEO, AUDIO)


@dataclass(frozen=True)
class MediaTimeouts:
    """Seconds a fetch may take: to connect, between two reads, and for the whole download
    (redirects included), so a server trickling a byte a second cannot hold a worker."""

    connect_s: float = 5.0
    read_s: float = 10.0
    total_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("connect_s", "read_s", "total_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise EngineConfigError(
                    f"media_{name}", f"`media_{name}` must be a positive number; got {value!r}"
                )


@dataclass(frozen=True)
class MediaLimits:
    """Per-route counts and per-kind caps.

    Byte caps apply to the media's bytes (a data URI's decoded bytes, a download, a file):
    image 20 MiB, video 512 MiB, audio 20 MiB. ``kinds`` are the part types a route takes.
    The decoding caps guard memory, since a small file can decode to a huge array: an image's
    longest side (16,384 px) and pixel count (8192 x 8192), the frames sampled from a video,
    a video frame's longest side, the bytes of one video's sampled RGB frames together
    (1 GiB: 32 frames of 4K video fit, 256 of 1080p do not), and the seconds of audio decoded.
    """

    max_items: int
    kinds: frozenset[str]
    max_image_bytes: int = 20 * MiB
    max_video_bytes: int = 512 * MiB
    max_audio_bytes: int = 20 * MiB
    max_image_side: int = 16_384
    max_image_pixels: int = 8192 * 8192
    max_video_frames: int = 256
    max_video_side: int = 8192
    max_video_sample_bytes: int = 1024 * MiB
    max_audio_seconds: float = 3600.0

    @classmethod
    def chat(cls) -> MediaLimits:
        """MindIE chat: images, videos and audio, at most 20 of them together per request."""
        return cls(max_items=20, kinds=frozenset(KINDS))

    @classmethod
    def generate(cls) -> MediaLimits:
        """MindIE generate and generate_stream: at most one image per request."""
        return cls(max_items=1, kinds=frozenset({IMAGE}))

    def max_bytes(self, kind: str) -> int:
        """The byte cap of one part of ``kind``."""
        return {
            IMAGE: self.max_image_bytes,
            VIDEO: self.max_video_bytes,
            AUDIO: self.max_audio_bytes,
        }[kind]


@dataclass(frozen=True)
class MediaPolicy:
    """Where media may come from (see the module docstring for the flags that set it).

    Build it with `MediaPolicy.create`, which checks the root and normalises the hosts; the
    constructor trusts its arguments (``allowed_local_media_path`` already resolved).
    """

    allowed_local_media_path: Path | None = None
    allowed_media_domains: frozenset[str] = frozenset()
    timeouts: MediaTimeouts = field(default_factory=MediaTimeouts)
    limits: MediaLimits = field(default_factory=MediaLimits.chat)

    @classmethod
    def create(
        cls,
        allowed_local_media_path: str | Path | None = None,
        allowed_media_domains: str | Iterable[str] | None = None,
        timeouts: MediaTimeouts | None = None,
        limits: MediaLimits | None = None,
    ) -> MediaPolicy:
        """A checked policy. ``allowed_media_domains`` may be a comma-separated string (the
        flag's value) or a list. Raises EngineConfigError naming the option at fault."""
        return cls(
            allowed_local_media_path=_media_root(allowed_local_media_path),
            allowed_media_domains=_domains(allowed_media_domains),
            timeouts=timeouts or MediaTimeouts(),
            limits=limits or MediaLimits.chat(),
        )

    def with_limits(self, limits: MediaLimits) -> MediaPolicy:
        """The same sources under a route's limits (`MediaLimits.generate` for generate)."""
        return dataclasses.replace(self, limits=limits)


def _media_root(value: str | Path | None) -> Path | None:
    name = "allowed_local_media_path"
    if value is None or value == "":
        return None
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise EngineConfigError(name, f"`{name}` must be an absolute directory; got {str(value)!r}")
    try:
        root = path.resolve(strict=True)
    except (OSError, RuntimeError) as error:
        raise EngineConfigError(
            name, f"`{name}` {str(value)!r} does not exist or cannot be read: {error}"
        ) from error
    if not root.is_dir():
        raise EngineConfigError(name, f"`{name}` {str(value)!r} is not a directory")
    return root


def _domains(value: str | Iterable[str] | None) -> frozenset[str]:
    name = "allowed_media_domains"
    if value is None or (isinstance(value, str) and not value.strip()):
        return frozenset()
    items = value.split(",") if isinstance(value, str) else list(value)
    hosts = set()
    for item in items:
        if not isinstance(item, str):
            raise EngineConfigError(name, f"`{name}` must list host names; got {item!r}")
        host = normalize_host(item)
        if not host or any(c in host for c in "/@ \t?#") or "://" in item:
            raise EngineConfigError(
                name, f"`{name}` takes host names such as 'images.example.com'; got {item!r}"
            )
        hosts.add(host)
    return frozenset(hosts)


def normalize_host(host: str) -> str:
    """A host as the allow-list compares it: trimmed, lowercase, no trailing dot, no IPv6
    brackets."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host
