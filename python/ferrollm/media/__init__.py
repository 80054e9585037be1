"""Media intake for multimodal requests: a content part's location turned into decoded media,
safely (see each module for its rules).

- `parts`: ``image_url`` / ``video_url`` / ``audio_url`` parts in MindIE's and OpenAI's shapes.
- `options`: `MediaPolicy` (where media may come from), `MediaLimits` (per-route caps).
- `sniff`: the format, from the bytes; `image`, `video`, `audio`: decoding.
- `loader`: `decode_media` picks the decoder for a part's bytes.

Importing this package needs only numpy: Pillow and PyAV (the ``media`` extra) are imported
when something is decoded.
"""

from ferrollm.media._deps import require_media_deps
from ferrollm.media.errors import MediaDependencyError, MediaError
from ferrollm.media.items import AudioMedia, ImageMedia, MediaItem, VideoMedia
from ferrollm.media.loader import decode_media
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
    "parse_media_part",
    "require_media_deps",
]
