"""Decoding an audio part with PyAV (FFmpeg) into mono float32 samples at the rate a model
wants: FFmpeg's resampler changes the rate, keeping the channels, and mono is their mean.

As for video, the demuxer is the one the bytes were sniffed as (mp3, wav, flac). Decoding stops
with ``media_too_large`` once the output passes ``MediaLimits.max_audio_seconds``: a 20 MiB
low-bitrate MP3 can hold hours, which would decode to gigabytes of samples.

A cut-off file is ``invalid_media``: FLAC's decoder fails on one, but FFmpeg reads a WAV file
up to wherever its bytes end, so a WAV whose RIFF header declares more bytes than arrived is
refused before decoding (a header of 0 or 0xFFFFFFFF, as streaming writers leave it, declares
no length). An MP3 is a run of frames with no total to check against.
"""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt

from ferrollm.media._deps import missing
from ferrollm.media.errors import INVALID_MEDIA, MEDIA_TOO_LARGE, MediaError
from ferrollm.media.items import AudioMedia
from ferrollm.media.options import MediaLimits

#: Sniffed format -> FFmpeg demuxer.
DEMUXERS = {"mp3": "mp3", "wav": "wav", "flac": "flac"}


def decode_audio(
    data: bytes, fmt: str, part_path: str, limits: MediaLimits, sample_rate: int
) -> AudioMedia:
    """``data`` (sniffed as ``fmt``) as mono float32 at ``sample_rate`` Hz. Raises MediaError
    naming ``part_path``."""
    try:
        import av
    except ImportError as error:
        raise missing("PyAV") from error
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive; got {sample_rate}")
    if fmt == "wav":
        _check_riff_length(data, part_path)
    max_samples = int(limits.max_audio_seconds * sample_rate)
    chunks: list[npt.NDArray[np.float32]] = []
    count = 0

    def keep(frames: list[av.AudioFrame]) -> None:
        nonlocal count
        for out in frames:
            # Planar float: one row per channel. Mono is their mean, as librosa and the
            # Hugging Face feature extractors make it; FFmpeg's own downmix scales by
            # 1/sqrt(2) per channel, which is louder and can pass 1.0.
            planes = np.asarray(out.to_ndarray(), dtype=np.float32)
            samples = planes.mean(axis=0, dtype=np.float32) if planes.ndim == 2 else planes
            count += len(samples)
            if count > max_samples:
                raise MediaError(
                    part_path,
                    MEDIA_TOO_LARGE,
                    f"the audio is longer than the {limits.max_audio_seconds:g} seconds "
                    "decoded per part",
                )
            chunks.append(samples)

    try:
        with av.open(io.BytesIO(data), format=DEMUXERS[fmt]) as container:
            if not container.streams.audio:
                raise MediaError(part_path, INVALID_MEDIA, "the file has no audio stream")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="fltp", rate=sample_rate)
            for frame in container.decode(stream):
                keep(resampler.resample(frame))
            keep(resampler.resample(None))
    except MediaError:
        raise
    except (av.FFmpegError, OSError, ValueError, EOFError) as error:
        raise MediaError(
            part_path, INVALID_MEDIA, f"the {fmt} audio cannot be decoded: {error}"
        ) from error
    if count == 0:
        raise MediaError(part_path, INVALID_MEDIA, "the audio has no samples")
    samples = np.concatenate(chunks).astype(np.float32, copy=False)
    return AudioMedia(samples=samples, sample_rate=sample_rate, format=fmt)


#: RIFF sizes that declare no length (a stream's header written before its end was known).
_UNKNOWN_RIFF_SIZES = (0, 0xFFFFFFFF)


def _check_riff_length(data: bytes, part_path: str) -> None:
    """MediaError when the RIFF header of WAV ``data`` declares more bytes than it has."""
    if len(data) < 8 or data[:4] != b"RIFF":
        return  # not a RIFF header: the demuxer says what is wrong
    declared = int.from_bytes(data[4:8], "little")
    if declared not in _UNKNOWN_RIFF_SIZES and declared + 8 > len(data):
        raise MediaError(
            part_path,
            INVALID_MEDIA,
            f"the wav file is truncated: its header declares {declared + 8} bytes, "
            f"{len(data)} arrived",
        )


def resample_audio(
    samples: npt.NDArray[np.float32], rate: int, target_rate: int
) -> npt.NDArray[np.float32]:
    """Mono float32 ``samples`` at ``rate`` Hz as ``target_rate`` Hz, through FFmpeg's
    resampler (the one `decode_audio` uses, so raw samples and decoded files agree)."""
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    if rate == target_rate:
        return samples
    try:
        import av
    except ImportError as error:
        raise missing("PyAV") from error
    if rate <= 0 or target_rate <= 0:
        raise ValueError(f"sample rates must be positive; got {rate} and {target_rate}")
    frame = av.AudioFrame.from_ndarray(samples[None, :], format="fltp", layout="mono")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="fltp", rate=target_rate, layout="mono")
    chunks = [out.to_ndarray()[0] for out in resampler.resample(frame)]
    chunks += [out.to_ndarray()[0] for out in resampler.resample(None)]
    if not chunks:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate(chunks).astype(np.float32, copy=False)
