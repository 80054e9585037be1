"""Decoding: images with Pillow, video frames and audio samples with PyAV, and every kind of
bad media refused naming its part."""

from __future__ import annotations

import asyncio
import base64
import io
import subprocess
import sys
import textwrap
import threading
import zlib

import numpy as np
import pytest
from media_samples import COLOURS, compressed_audio, jpeg, png, video, wav

from ferrollm.media import (
    AudioMedia,
    ImageMedia,
    MediaError,
    MediaLimits,
    MediaPart,
    MediaPolicy,
    VideoMedia,
    decode_media,
    load_media,
)
from ferrollm.media import loader as loader_module

POLICY = MediaPolicy.create()


def part(kind: str) -> MediaPart:
    return MediaPart(kind, "data:", f"messages[0].content[2].{kind}_url")


def bad(data: bytes, kind: str, code: str, policy: MediaPolicy = POLICY) -> MediaError:
    with pytest.raises(MediaError) as caught:
        decode_media(data, part(kind), policy)
    assert (caught.value.param, caught.value.code) == (part(kind).path, code)
    assert caught.value.message.startswith(part(kind).path)
    return caught.value


def test_jpeg_and_transparent_png_decode_to_rgb() -> None:
    item = decode_media(jpeg(), part("image"), POLICY)
    assert isinstance(item, ImageMedia)
    assert (item.format, item.image.mode, item.image.size) == ("jpeg", "RGB", (64, 64))
    clear = decode_media(png(3, 3, (0, 0, 0, 0)), part("image"), POLICY)
    assert isinstance(clear, ImageMedia)
    assert clear.image.mode == "RGB" and clear.image.getpixel((1, 1)) == (255, 255, 255)


def test_truncated_jpeg_is_invalid() -> None:
    data = jpeg()
    error = bad(data[: len(data) // 2], "image", "invalid_media")
    assert "jpeg" in error.message


def test_corrupt_png_is_invalid() -> None:
    data = bytearray(png(64, 64))
    start = data.index(b"IDAT") + 4
    data[start : start + 12] = b"\xff" * 12  # garbles the zlib stream
    bad(bytes(data), "image", "invalid_media")
    header = bytearray(png())
    header[29] ^= 0xFF  # IHDR's CRC
    bad(bytes(header), "image", "invalid_media")


def test_zero_byte_media_is_invalid() -> None:
    for kind in ("image", "video", "audio"):
        assert "empty" in bad(b"", kind, "invalid_media").message


def test_an_absurdly_wide_image_is_refused_before_decoding() -> None:
    data = png(50_000, 1)
    assert len(data) < 1000
    error = bad(data, "image", "media_too_large")
    assert "50000x1" in error.message and "16384" in error.message


def test_too_many_pixels_is_refused() -> None:
    limits = MediaLimits(max_items=1, kinds=frozenset({"image"}), max_image_pixels=99)
    bad(png(10, 10), "image", "media_too_large", POLICY.with_limits(limits))
    assert decode_media(png(9, 11), part("image"), POLICY.with_limits(limits))


def test_a_decompression_bomb_is_too_large() -> None:
    # 2 x 10^9 pixels: Pillow's own guard fires while opening, before our size check.
    from PIL import Image

    header = bytearray(png(1, 1))
    header[16:24] = (50_000).to_bytes(4, "big") + (40_000).to_bytes(4, "big")
    header[29:33] = zlib.crc32(bytes(header[12:29])).to_bytes(4, "big")
    assert 2 * Image.MAX_IMAGE_PIXELS < 50_000 * 40_000
    bad(bytes(header), "image", "media_too_large")


@pytest.mark.parametrize(
    ("data", "kind", "said"),
    [
        (png(), "audio", "image data (png)"),
        (wav(0.01), "image", "audio data (wav)"),
        (jpeg(), "video", "image data (jpeg)"),
        (b"BM" + bytes(100), "image", "not a supported image format"),
        (b"%PDF-1.7" + bytes(100), "video", "not a supported video format"),
        (b"\0\0\0\x1cftypavif" + bytes(100), "image", "not a supported image format"),
    ],
)
def test_wrong_format_for_the_part_names_the_part(data: bytes, kind: str, said: str) -> None:
    error = bad(data, kind, "unsupported_content_type")
    assert said in error.message and f"'{kind}_url'" in error.message


def test_garbage_after_a_valid_signature_is_invalid() -> None:
    bad(b"RIFF\0\0\0\0AVI " + bytes(200), "video", "invalid_media")
    bad(b"fLaC" + bytes(200), "audio", "invalid_media")


@pytest.mark.parametrize(
    ("container", "codec"), [("mp4", "mpeg4"), ("avi", "mpeg4"), ("asf", "wmv2")]
)
def test_video_frames_are_sampled_uniformly(container: str, codec: str) -> None:
    item = decode_media(video(container, codec, frames=12), part("video"), POLICY, video_frames=4)
    assert isinstance(item, VideoMedia)
    assert item.format == {"mp4": "mp4", "avi": "avi", "asf": "wmv"}[container]
    assert item.total_frames == 12
    assert item.frames.shape == (4, 32, 32, 3) and item.frames.dtype == np.uint8
    assert item.indices.tolist() == [1, 4, 7, 10]
    centres = item.frames[:, 16, 16].astype(int)
    expected = np.array([COLOURS[i % 4] for i in (1, 4, 7, 10)])
    assert np.abs(centres - expected).max() <= 12
    assert item.fps == pytest.approx(4.0)
    assert item.timestamps == pytest.approx([0.25, 1.0, 1.75, 2.5], abs=0.02)


def test_short_videos_give_every_frame_and_the_cap_holds() -> None:
    item = decode_media(video(frames=3), part("video"), POLICY, video_frames=8)
    assert isinstance(item, VideoMedia) and item.indices.tolist() == [0, 1, 2]
    capped = POLICY.with_limits(
        MediaLimits(max_items=1, kinds=frozenset({"video"}), max_video_frames=2)
    )
    item = decode_media(video(frames=12), part("video"), capped, video_frames=8)
    assert isinstance(item, VideoMedia) and item.indices.tolist() == [3, 9]


def test_video_frame_size_and_sample_bytes_are_capped() -> None:
    def limits(**caps: int) -> MediaPolicy:
        return POLICY.with_limits(MediaLimits(max_items=1, kinds=frozenset({"video"}), **caps))

    error = bad(video(), "video", "media_too_large", limits(max_video_side=31))
    assert "32x32" in error.message
    # 4 frames of 32x32 RGB are 12,288 bytes.
    bad(video(), "video", "media_too_large", limits(max_video_sample_bytes=12_287))
    item = decode_media(
        video(), part("video"), limits(max_video_sample_bytes=12_288), video_frames=4
    )
    assert isinstance(item, VideoMedia) and len(item.frames) == 4


def test_truncated_video_is_invalid() -> None:
    data = video()
    bad(data[:40], "video", "invalid_media")


def _peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[spectrum.argmax()])


def test_wav_is_resampled_to_mono_at_the_requested_rate() -> None:
    item = decode_media(wav(1.0, 8000, channels=2), part("audio"), POLICY, sample_rate=16000)
    assert isinstance(item, AudioMedia)
    assert (item.format, item.sample_rate, item.samples.dtype) == ("wav", 16000, np.float32)
    assert abs(len(item.samples) - 16000) <= 32
    assert _peak_hz(item.samples, 16000) == pytest.approx(440, abs=2)
    # Mono is the mean of the channels: the right one is silent, so the amplitude halves.
    middle = item.samples[2000:14000]
    assert np.abs(middle).max() == pytest.approx(0.25, abs=0.01)
    t = np.arange(2000, 14000) / 16000
    assert np.abs(middle - 0.25 * np.sin(2 * np.pi * 440 * t)).max() < 0.02


def test_truncated_audio_is_invalid() -> None:
    data = wav(1.0)
    error = bad(data[: len(data) // 2], "audio", "invalid_media")
    assert "truncated" in error.message
    # A streaming writer's header declares no length: the bytes that came are the clip.
    for unknown in (b"\x00\x00\x00\x00", b"\xff\xff\xff\xff"):
        streamed = data[:4] + unknown + data[8 : len(data) // 2]
        item = decode_media(streamed, part("audio"), POLICY, sample_rate=16000)
        assert isinstance(item, AudioMedia) and 0 < len(item.samples) < 16000
    flac = compressed_audio("flac", "flac")
    bad(flac[: len(flac) // 8], "audio", "invalid_media")


def test_audio_longer_than_the_cap_is_refused() -> None:
    limits = MediaLimits(max_items=1, kinds=frozenset({"audio"}), max_audio_seconds=0.5)
    bad(wav(1.0), "audio", "media_too_large", POLICY.with_limits(limits))


@pytest.mark.parametrize(("container", "codec"), [("flac", "flac"), ("mp3", "libmp3lame")])
def test_compressed_audio_decodes(container: str, codec: str) -> None:
    import av

    if codec not in av.codecs_available:
        pytest.skip(f"this FFmpeg build has no {codec} encoder")
    item = decode_media(
        compressed_audio(container, codec), part("audio"), POLICY, sample_rate=16000
    )
    assert isinstance(item, AudioMedia) and item.format == container
    assert abs(len(item.samples) - 16000) <= 800
    assert _peak_hz(item.samples, 16000) == pytest.approx(440, abs=2)
    assert np.abs(item.samples).max() == pytest.approx(0.5, abs=0.05)


def test_load_media_decodes_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    real = loader_module.load_media_sync

    def spy(*args: object, **kwargs: object) -> object:
        threads.append(threading.get_ident())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loader_module, "load_media_sync", spy)
    url = "data:image/png;base64," + base64.b64encode(png()).decode()
    item = asyncio.run(load_media(MediaPart("image", url, "p"), POLICY))
    assert isinstance(item, ImageMedia) and item.width == 4
    assert threads and threads[0] != threading.get_ident()


def test_the_package_imports_without_pillow_or_pyav() -> None:
    code = textwrap.dedent(
        """
        import sys

        class Blocked:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("PIL", "av", "torch"):
                    raise ImportError(f"{name} is blocked in this test")
                return None

        sys.meta_path.insert(0, Blocked())
        from ferrollm.media import MediaDependencyError, MediaPolicy, MediaPart, decode_media
        from ferrollm.media import require_media_deps
        try:
            decode_media(b"\\x89PNG\\r\\n\\x1a\\n", MediaPart("image", "x", "p"), MediaPolicy())
        except MediaDependencyError as error:
            print("image:", error)
        try:
            require_media_deps()
        except MediaDependencyError as error:
            print("deps:", error)
        print(sorted(m for m in ("PIL", "av", "torch") if m in sys.modules))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("image: Pillow is not installed") and "ferrollm[media]" in lines[0]
    assert lines[1].startswith("deps: Pillow is not installed")
    assert lines[2] == "[]"


def test_decoded_image_is_independent_of_the_input_buffer() -> None:
    data = bytearray(png(2, 2))
    item = decode_media(bytes(data), part("image"), POLICY)
    assert isinstance(item, ImageMedia)
    out = io.BytesIO()
    item.image.save(out, format="PNG")
    assert out.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
