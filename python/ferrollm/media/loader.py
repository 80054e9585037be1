"""One call from a media part to decoded media: read the bytes within the policy, check that
their format is one the part's kind takes, decode.

`load_media_sync` blocks (network, disk, decoding). `load_media` runs it in a worker thread
with `asyncio.to_thread`, so a request handler can await it without stalling the event loop;
cancelling the await does not stop the thread, but the fetch's timeouts and byte cap bound
what it can still do.
"""

from __future__ import annotations

import asyncio

from ferrollm.media.audio import decode_audio
from ferrollm.media.image import decode_image
from ferrollm.media.items import MediaItem
from ferrollm.media.options import AUDIO, IMAGE, MediaPolicy
from ferrollm.media.parts import MediaPart
from ferrollm.media.sniff import check_format
from ferrollm.media.sources import read_media_bytes
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


def load_media_sync(
    part: MediaPart,
    policy: MediaPolicy,
    *,
    video_frames: int = DEFAULT_VIDEO_FRAMES,
    sample_rate: int = DEFAULT_SAMPLE_RATE,
) -> MediaItem:
    """``part`` read within ``policy`` and decoded: `ImageMedia`, `VideoMedia` or
    `AudioMedia` by its kind. Blocking. Raises MediaError naming the part, or
    MediaDependencyError when Pillow or PyAV is missing."""
    data = read_media_bytes(part, policy)
    return decode_media(data, part, policy, video_frames=video_frames, sample_rate=sample_rate)


async def load_media(
    part: MediaPart,
    policy: MediaPolicy,
    *,
    video_frames: int = DEFAULT_VIDEO_FRAMES,
    sample_rate: int = DEFAULT_SAMPLE_RATE,
) -> MediaItem:
    """`load_media_sync` in a worker thread, for the event loop."""
    return await asyncio.to_thread(
        load_media_sync, part, policy, video_frames=video_frames, sample_rate=sample_rate
    )
