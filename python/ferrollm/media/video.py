"""Decoding a video part with PyAV (FFmpeg): a uniform sample of its frames as RGB arrays.

The container is opened with the one demuxer its bytes were sniffed as (MP4/MOV, AVI, ASF for
WMV), so FFmpeg never probes client bytes as a playlist or another format that could open
further files or URLs. Frames are counted by demuxing first (cheap, and right where a
container's frame count is missing or wrong, as AVI and WMV often are), then ``num_frames``
indices are spread evenly over them and only those frames are converted; the others are
decoded, as inter-frame codecs require, and dropped at once.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from ferrollm.media._deps import missing
from ferrollm.media.errors import INVALID_MEDIA, MEDIA_TOO_LARGE, MediaError
from ferrollm.media.items import VideoMedia
from ferrollm.media.options import MediaLimits

if TYPE_CHECKING:
    import av.container

#: Sniffed format -> FFmpeg demuxer.
DEMUXERS = {"mp4": "mov", "avi": "avi", "wmv": "asf"}


def sample_indices(total: int, count: int) -> list[int]:
    """``count`` frame indices spread evenly over ``total`` frames: the centre of each of
    ``count`` equal spans (all of them when there are no more than ``count``)."""
    if total <= count:
        return list(range(total))
    return sorted({int((i + 0.5) * total / count) for i in range(count)})


def decode_video(
    data: bytes, fmt: str, part_path: str, limits: MediaLimits, num_frames: int
) -> VideoMedia:
    """``num_frames`` frames (at most ``limits.max_video_frames``) sampled uniformly from
    ``data``, sniffed as ``fmt``. Raises MediaError naming ``part_path``."""
    try:
        import av
    except ImportError as error:
        raise missing("PyAV") from error
    if num_frames <= 0:
        raise ValueError(f"num_frames must be positive; got {num_frames}")
    wanted = min(num_frames, limits.max_video_frames)
    try:
        with av.open(io.BytesIO(data), format=DEMUXERS[fmt]) as container:
            total = _count_frames(container, part_path)
        picks = sample_indices(total, wanted)
        with av.open(io.BytesIO(data), format=DEMUXERS[fmt]) as container:
            return _decode(container, fmt, picks, total, part_path, limits)
    except MediaError:
        raise
    except (av.FFmpegError, OSError, ValueError, EOFError) as error:
        raise MediaError(
            part_path, INVALID_MEDIA, f"the {fmt} video cannot be decoded: {error}"
        ) from error


def _count_frames(container: av.container.InputContainer, part_path: str) -> int:
    if not container.streams.video:
        raise MediaError(part_path, INVALID_MEDIA, "the file has no video stream")
    stream = container.streams.video[0]
    total = sum(1 for packet in container.demux(stream) if packet.size > 0)
    if total == 0:
        raise MediaError(part_path, INVALID_MEDIA, "the video has no frames")
    return total


def _decode(
    container: av.container.InputContainer,
    fmt: str,
    picks: list[int],
    total: int,
    part_path: str,
    limits: MediaLimits,
) -> VideoMedia:
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    _check_frame_size(
        stream.codec_context.width, stream.codec_context.height, picks, part_path, limits
    )
    wanted = set(picks)
    frames: list[np.ndarray] = []
    times: list[float] = []
    indices: list[int] = []
    rate = stream.average_rate
    fps = float(rate) if rate else 0.0
    for index, frame in enumerate(container.decode(stream)):
        if index >= total or len(indices) == len(picks):
            break
        if index not in wanted:
            continue
        if frame.time is not None:
            times.append(float(frame.time))
        else:
            times.append(index / fps if fps else 0.0)
        # The header's size can be missing or wrong; the decoded frame's is the real one.
        _check_frame_size(frame.width, frame.height, picks, part_path, limits)
        frames.append(frame.to_ndarray(format="rgb24"))
        indices.append(index)
    if not frames:
        raise MediaError(part_path, INVALID_MEDIA, "no frame of the video could be decoded")
    if len({f.shape for f in frames}) != 1:
        raise MediaError(part_path, INVALID_MEDIA, "the video's frames change size")
    duration = _duration(stream.duration, stream.time_base, container.duration)
    if duration == 0.0 and fps:
        duration = total / fps
    return VideoMedia(
        frames=np.stack(frames).astype(np.uint8, copy=False),
        timestamps=np.asarray(times, dtype=np.float64),
        indices=np.asarray(indices, dtype=np.int64),
        fps=fps,
        total_frames=total,
        duration_s=duration,
        format=fmt,
    )


def _check_frame_size(
    width: int, height: int, picks: list[int], part_path: str, limits: MediaLimits
) -> None:
    if max(width, height) > limits.max_video_side:
        raise MediaError(
            part_path,
            MEDIA_TOO_LARGE,
            f"the video is {width}x{height} pixels; its longest side may be at most "
            f"{limits.max_video_side}",
        )
    sample_bytes = len(picks) * width * height * 3
    if sample_bytes > limits.max_video_sample_bytes:
        raise MediaError(
            part_path,
            MEDIA_TOO_LARGE,
            f"{len(picks)} frames of {width}x{height} pixels take {sample_bytes / 2**20:.0f} MiB "
            f"as RGB; at most {limits.max_video_sample_bytes / 2**20:g} MiB are sampled per video",
        )


def _duration(
    stream_duration: int | None, time_base: Fraction | None, container_duration: int | None
) -> float:
    if stream_duration is not None and time_base is not None:
        return float(stream_duration * time_base)
    if container_duration is not None:
        return container_duration / 1_000_000  # FFmpeg's AV_TIME_BASE
    return 0.0
