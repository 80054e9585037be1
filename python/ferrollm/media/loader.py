"""From a media part's bytes to decoded media: check that their format is one the part's kind
takes, then decode with the kind's decoder."""

from __future__ import annotations

from ferrollm.media.audio import decode_audio
from ferrollm.media.image import decode_image
from ferrollm.media.items import MediaItem
from ferrollm.media.options import AUDIO, IMAGE, MediaPolicy
from ferrollm.media.parts import MediaPart
from ferrollm.media.sniff import check_format
from ferrollm.media.video import decode_video

#: Frames sampled from a video unless the caller asks otherwise (capped by the limits).
DEFAULT_VIDEO_FRAMES = 32
#: Audio's sample rate unless the caller asks otherwise (Whisper-style encoders take 16 kHz).
DEFAULT_SAMPLE_RATE = 16_000


def decode_media(
    data: bytes,
    part: MediaPart,
    policy: MediaPolicy,
    *,
    video_frames: int = DEFAULT_VIDEO_FRAMES,
    sample_rate: int = DEFAULT_SAMPLE_RATE,
) -> MediaItem:
    """``data`` decoded as ``part``'s kind; raises MediaError naming the part."""
    fmt = check_format(data, part.kind, part.path, part.part_type)
    limits = policy.limits
    if part.kind == IMAGE:
        return decode_image(data, fmt, part.path, limits)
    if part.kind == AUDIO:
        return decode_audio(data, fmt, part.path, limits, sample_rate)
    return decode_video(data, fmt, part.path, limits, video_frames)
