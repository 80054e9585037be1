"""The offline API's media prompts (``LLM.generate`` / ``LLM.chat``), in vLLM's shapes.

* ``generate`` takes ``{"prompt": "... <image> ...", "multi_modal_data": {"image": img or
  [img, ...]}}`` with Pillow images, one per placeholder in order; an audio model's
  ``{"audio": (samples, rate) or [(samples, rate), ...]}`` takes mono samples at any rate,
  resampled to the processor's; a video model's ``{"video": frames or [frames, ...]}`` takes
  uint8 RGB frames ``[F, H, W, 3]`` (already sampled, as vLLM's) or `VideoMedia`.
* ``chat`` takes OpenAI content parts: ``{"type": "text", "text": ...}``, ``{"type":
  "image_url", "image_url": {"url": ...}}`` (a data URI or a local path, read with a policy
  that trusts the caller's own files, as an offline caller is the machine's user) and
  ``{"type": "image_pil", "image_pil": img}``; an ``audio_url`` part for an audio model,
  decoded at the processor's rate; a ``video_url`` part for a video model. The conversation
  the template sees holds each media part as the processor's placeholder: as ``{"type":
  "image"}`` parts for a template that walks content parts (SmolVLM's, whose template also
  needs plain text content as a text part), else as text joined into one string.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ferrollm.media.items import AudioMedia, ImageMedia, MediaItem, VideoMedia
from ferrollm.media.loader import load_media_sync
from ferrollm.media.options import MediaPolicy
from ferrollm.media.parts import is_media_part, parse_media_part
from ferrollm.multimodal.inputs import (
    DEFAULT_AUDIO_RATE,
    MediaKind,
    MultimodalProcessor,
    audio_rate,
)
from ferrollm.multimodal.templates import reads_parts, template_part

#: Offline callers read their own files: any absolute path is allowed.
_OFFLINE_POLICY = MediaPolicy.create(allowed_local_media_path="/")


def image_media(image: Any, where: str) -> ImageMedia:
    """A Pillow image as `ImageMedia`; ValueError naming ``where`` for anything else."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise ValueError(f"`{where}` must be a PIL.Image; got {type(image).__name__}")
    return ImageMedia(image, (image.format or "pil").lower(), image.width, image.height)


def video_media(value: Any, where: str) -> VideoMedia:
    """Frames ``[F, H, W, 3]`` uint8 (or a `VideoMedia`, kept) as `VideoMedia`, at unknown
    timing; ValueError naming ``where`` for anything else."""
    if isinstance(value, VideoMedia):
        return value
    frames = np.asarray(value) if isinstance(value, np.ndarray) else None
    if frames is None or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise ValueError(f"`{where}` must be uint8 RGB frames of shape [F, H, W, 3]")
    count = frames.shape[0]
    times = np.zeros(count, dtype=np.float64)
    return VideoMedia(frames, times, np.arange(count), 0.0, count, 0.0, "frames")


def audio_media(value: Any, where: str, sample_rate: int) -> AudioMedia:
    """``(samples, rate)`` (vLLM's shape: mono samples, a rate in Hz) as `AudioMedia` at
    ``sample_rate``; ValueError naming ``where`` for anything else."""
    from ferrollm.media.audio import resample_audio

    if isinstance(value, AudioMedia):
        samples, rate = value.samples, value.sample_rate
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        samples, rate = value
    else:
        raise ValueError(f"`{where}` must be a (samples, sample_rate) pair")
    array = np.asarray(samples, dtype=np.float32)
    if array.ndim != 1 or not array.size:
        raise ValueError(f"`{where}`: the samples must be a non-empty 1-D (mono) array")
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise ValueError(f"`{where}`: the sample rate must be a positive integer; got {rate!r}")
    array = resample_audio(array, int(rate), sample_rate)
    return AudioMedia(samples=array, sample_rate=sample_rate, format="pcm")


def prompt_media(
    prompt: Mapping[str, Any], where: str, sample_rate: int = DEFAULT_AUDIO_RATE
) -> tuple[str, list[MediaItem]]:
    """The text and media of a vLLM-shaped prompt dict at ``where`` (``prompts[0]``): images,
    or audio clips resampled to ``sample_rate``."""
    text = prompt.get("prompt")
    if not isinstance(text, str):
        raise ValueError(f"`{where}.prompt` must be text")
    data = prompt.get("multi_modal_data") or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"`{where}.multi_modal_data` must be a mapping")
    unknown = sorted(set(data) - {"image", "audio", "video"})
    if unknown:
        raise ValueError(
            f"`{where}.multi_modal_data.{unknown[0]}`: only images, audio and video are supported"
        )
    images = data.get("image", [])
    if not isinstance(images, (list, tuple)):
        images = [images]
    media: list[MediaItem] = [
        image_media(image, f"{where}.multi_modal_data.image[{i}]") for i, image in enumerate(images)
    ]
    clips = data.get("audio", [])
    if isinstance(clips, AudioMedia) or (
        isinstance(clips, tuple) and len(clips) == 2 and not isinstance(clips[1], tuple)
    ):
        clips = [clips]  # one (samples, rate) pair
    media += [
        audio_media(clip, f"{where}.multi_modal_data.audio[{i}]", sample_rate)
        for i, clip in enumerate(clips)
    ]
    videos = data.get("video", [])
    if isinstance(videos, (np.ndarray, VideoMedia)):
        videos = [videos]
    media += [
        video_media(video, f"{where}.multi_modal_data.video[{i}]") for i, video in enumerate(videos)
    ]
    return text, media


def chat_media(
    messages: Sequence[Mapping[str, Any]],
    processor: MultimodalProcessor | None,
    chat_template: str | None,
    where: str = "messages",
) -> tuple[list[dict[str, Any]], list[MediaItem]]:
    """``messages`` with each media part replaced for the template, and the media decoded,
    in order. A conversation without media comes back unchanged; one with media needs a
    multimodal ``processor`` (ValueError naming the part otherwise)."""
    walks_parts = reads_parts(chat_template)
    out: list[dict[str, Any]] = []
    media: list[MediaItem] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, str) and walks_parts and processor is not None:
            # SmolVLM's template only walks parts: text alone would render as nothing.
            out.append({**message, "content": [{"type": "text", "text": content}]})
            continue
        if isinstance(content, str) or not isinstance(content, Sequence):
            out.append(dict(message))
            continue
        parts: list[Any] = []
        found = 0
        for j, part in enumerate(content):
            here = f"{where}[{i}].content[{j}]"
            rate = DEFAULT_AUDIO_RATE if processor is None else audio_rate(processor)
            item = _media_item(part, here, rate)
            if item is None:
                parts.append(part)
                continue
            if processor is None:
                raise ValueError(f"`{here}`: this model takes text only")
            kind = _kind_of(item)
            if kind not in processor.modalities:
                raise ValueError(f"`{here}`: this model does not take {kind}")
            media.append(item)
            found += 1
            parts.append(template_part(kind))
        if not found:
            out.append(dict(message))
        elif walks_parts:
            out.append({**message, "content": parts})
        else:
            assert processor is not None
            text = "".join(_part_text(p, processor) for p in parts)
            out.append({**message, "content": text})
    return out, media


def _kind_of(item: MediaItem) -> MediaKind:
    """An item's media kind."""
    if isinstance(item, ImageMedia):
        return "image"
    return "audio" if isinstance(item, AudioMedia) else "video"


def _part_text(part: Any, processor: MultimodalProcessor) -> str:
    """A content part as text: a media part's placeholder, a text part's text."""
    if isinstance(part, Mapping):
        kind = part.get("type")
        if kind in ("image", "audio", "video"):
            return processor.placeholder(kind)
        return str(part.get("text", ""))
    return str(part)


def _media_item(part: Any, where: str, sample_rate: int) -> MediaItem | None:
    """The media of a content part, decoded; None for a part that is not media."""
    if not isinstance(part, Mapping):
        return None
    if part.get("type") == "image_pil":
        return image_media(part.get("image_pil"), f"{where}.image_pil")
    if not is_media_part(part):
        return None
    parsed = parse_media_part(part, where)
    if parsed.kind not in ("image", "audio", "video"):
        raise ValueError(f"`{where}`: only images, audio and video are supported")
    url = parsed.url
    if ":" not in url.split("/", 1)[0] and not url.startswith("/"):  # a relative path
        parsed = type(parsed)(parsed.kind, str(Path(url).resolve()), parsed.path)
    return load_media_sync(parsed, _OFFLINE_POLICY, sample_rate=sample_rate)
