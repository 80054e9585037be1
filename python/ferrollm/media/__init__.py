"""Media intake for multimodal requests: a content part's location turned into decoded media,
safely (see each module for its rules).

- `parts`: ``image_url`` / ``video_url`` / ``audio_url`` parts in MindIE's and OpenAI's shapes.
- `options`: `MediaPolicy` (where media may come from), `MediaLimits` (per-route caps).
"""

from ferrollm.media.errors import MediaError
from ferrollm.media.options import MediaLimits, MediaPolicy, MediaTimeouts
from ferrollm.media.parts import MediaPart, check_media_count, is_media_part, parse_media_part

__all__ = [
    "MediaError",
    "MediaLimits",
    "MediaPart",
    "MediaPolicy",
    "MediaTimeouts",
    "check_media_count",
    "is_media_part",
    "parse_media_part",
]
