"""Media intake for multimodal requests: a content part's location turned into decoded media,
safely (see each module for its rules).

- `parts`: ``image_url`` / ``video_url`` / ``audio_url`` parts in MindIE's and OpenAI's shapes.
- `options`: `MediaPolicy` (where media may come from), `MediaLimits` (per-route caps).
- `sources`, `fetch`: the bytes, from a data URI, an allowed local file or an http(s) URL.
- `sniff`: the format, from the bytes; `image`, `video`, `audio`: decoding.
- `loader`: `load_media` (async) and `load_media_sync` put these together.

Importing this package needs only numpy: Pillow and PyAV (the ``media`` extra) are imported
when something is decoded.
"""

from ferrollm.media._deps import require_media_deps
from ferrollm.media.errors import MediaDependencyError, MediaError
from ferrollm.media.items import AudioMedia, ImageMedia, MediaItem, VideoMedia
from ferrollm.media.loader import decode_media, load_media, load_media_sync
from ferrollm.media.options import MediaLimits, MediaPolicy, MediaTimeouts
from ferrollm.media.parts import MediaPart, check_media_count, is_media_part, parse_media_part

__all__ = [
    "AudioMedia",
    "ImageMedia",
    "MediaDependencyError",
    "MediaError",
    "MediaItem",
    "MediaLimits",
    "MediaPart",
    "MediaPolicy",
    "MediaTimeouts",
    "VideoMedia",
    "check_media_count",
    "decode_media",
    "is_media_part",
    "load_media",
    "load_media_sync",
    "parse_media_part",
    "require_media_deps",
]
