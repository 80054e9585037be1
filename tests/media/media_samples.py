"""Small media files made on the fly for the media tests: images with Pillow, videos and
compressed audio with PyAV, WAV with the standard library. Each is a few KiB at most."""

from __future__ import annotations

import io
import math
import struct
import wave

import numpy as np


def png(width: int = 4, height: int = 3, colour: tuple[int, ...] = (10, 200, 30)) -> bytes:
    from PIL import Image

    mode = "RGBA" if len(colour) == 4 else "RGB"
    out = io.BytesIO()
    Image.new(mode, (width, height), colour).save(out, format="PNG")
    return out.getvalue()


def jpeg(width: int = 64, height: int = 64) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def wav(
    seconds: float = 1.0, rate: int = 8000, freq: float = 440.0, amp: float = 0.5, channels: int = 1
) -> bytes:
    """A 16-bit PCM sine; with two channels the right one is silent."""
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(channels)
        file.setsampwidth(2)
        file.setframerate(rate)
        frames = bytearray()
        for i in range(int(seconds * rate)):
            value = int(amp * 32767 * math.sin(2 * math.pi * freq * i / rate))
            frames += struct.pack("<h", value) + (b"\0\0" if channels == 2 else b"")
        file.writeframes(bytes(frames))
    return out.getvalue()


#: Solid frame colours a test video cycles through.
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]


def video(container: str = "mp4", codec: str = "mpeg4", frames: int = 12, rate: int = 4) -> bytes:
    """``frames`` solid 32x32 frames cycling through `COLOURS`."""
    import av

    out = io.BytesIO()
    with av.open(out, "w", format=container) as file:
        stream = file.add_stream(codec, rate=rate)
        stream.width = stream.height = 32
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            pixels = np.zeros((32, 32, 3), np.uint8)
            pixels[:] = COLOURS[i % len(COLOURS)]
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                file.mux(packet)
        for packet in stream.encode():
            file.mux(packet)
    return out.getvalue()


def compressed_audio(container: str, codec: str, rate: int = 44100, freq: float = 440.0) -> bytes:
    """One second of a 0.5-amplitude sine, encoded by PyAV."""
    import av

    t = np.arange(rate) / rate
    sine = 0.5 * np.sin(2 * np.pi * freq * t)
    out = io.BytesIO()
    with av.open(out, "w", format=container) as file:
        stream = file.add_stream(codec, rate=rate, layout="mono")
        fmt = stream.codec_context.codec.audio_formats[0].name
        if fmt.startswith("s16"):
            samples = (sine * 32767).astype(np.int16)[None]
        elif fmt.startswith("s32"):
            samples = (sine * 2**31 * 0.999).astype(np.int32)[None]
        else:
            samples = sine.astype(np.float32)[None]
        frame = av.AudioFrame.from_ndarray(samples, format=fmt, layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            file.mux(packet)
        for packet in stream.encode(None):
            file.mux(packet)
    return out.getvalue()
