"""The offline API's media prompts (``LLM.generate`` / ``LLM.chat``), in vLLM's shapes.

* ``generate`` takes ``{"prompt": "... <image> ...", "multi_modal_data": {"image": img or
  [img, ...]}}`` with Pillow images, one per placeholder in order.
* ``chat`` takes OpenAI content parts: ``{"type": "text", "text": ...}``, ``{"type":
  "image_url", "image_url": {"url": ...}}`` (a data URI or a local path, read with a policy
  that trusts the caller's own files, as an offline caller is the machine's user) and
  ``{"type": "image_pil", "image_pil": img}``. The conversation the template sees holds each
  media part as the processor's placeholder: as ``{"type": "image"}`` parts for a template
  that walks content parts (SmolVLM's, whose template also needs plain text content as a
  text part), else as text joined into one string.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ferrollm.media.items import ImageMedia, MediaItem
from ferrollm.media.loader import load_media_sync
from ferrollm.media.options import MediaPolicy
from ferrollm.media.parts import is_media_part, parse_media_part
from ferrollm.multimodal.inputs import MultimodalProcessor

#: Offline callers read their own files: any absolute path is allowed.
_OFFLINE_POLICY = MediaPolicy.create(allowed_local_media_path="/")


def image_media(image: Any, where: str) -> ImageMedia:
    """A Pillow image as `ImageMedia`; ValueError naming ``where`` for anything else."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise ValueError(f"`{where}` must be a PIL.Image; got {type(image).__name__}")
    return ImageMedia(image, (image.format or "pil").lower(), image.width, image.height)


def prompt_media(prompt: Mapping[str, Any], where: str) -> tuple[str, list[MediaItem]]:
    """The text and images of a vLLM-shaped prompt dict at ``where`` (``prompts[0]``)."""
    text = prompt.get("prompt")
    if not isinstance(text, str):
        raise ValueError(f"`{where}.prompt` must be text")
    data = prompt.get("multi_modal_data") or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"`{where}.multi_modal_data` must be a mapping")
    unknown = sorted(set(data) - {"image"})
    if unknown:
        raise ValueError(f"`{where}.multi_modal_data.{unknown[0]}`: only images are supported")
    images = data.get("image", [])
    if not isinstance(images, (list, tuple)):
        images = [images]
    return text, [
        image_media(image, f"{where}.multi_modal_data.image[{i}]") for i, image in enumerate(images)
    ]


def chat_media(
    messages: Sequence[Mapping[str, Any]],
    processor: MultimodalProcessor | None,
    chat_template: str | None,
    where: str = "messages",
) -> tuple[list[dict[str, Any]], list[MediaItem]]:
    """``messages`` with each media part replaced for the template, and the media decoded,
    in order. A conversation without media comes back unchanged; one with media needs a
    multimodal ``processor`` (ValueError naming the part otherwise)."""
    walks_parts = chat_template is not None and _walks_parts(chat_template)
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
            item = _media_item(part, here)
            if item is None:
                parts.append(part)
                continue
            if processor is None:
                raise ValueError(f"`{here}`: this model takes text only")
            media.append(item)
            found += 1
            parts.append({"type": "image"})
        if not found:
            out.append(dict(message))
        elif walks_parts:
            out.append({**message, "content": parts})
        else:
            assert processor is not None
            text = "".join(_part_text(p, processor.placeholder("image")) for p in parts)
            out.append({**message, "content": text})
    return out, media


def _part_text(part: Any, placeholder: str) -> str:
    """A content part as text: an image's placeholder, a text part's text."""
    if isinstance(part, Mapping):
        return placeholder if part.get("type") == "image" else str(part.get("text", ""))
    return str(part)


def _media_item(part: Any, where: str) -> MediaItem | None:
    """The media of a content part, decoded; None for a part that is not media."""
    if not isinstance(part, Mapping):
        return None
    if part.get("type") == "image_pil":
        return image_media(part.get("image_pil"), f"{where}.image_pil")
    if not is_media_part(part):
        return None
    parsed = parse_media_part(part, where)
    if parsed.kind != "image":
        raise ValueError(f"`{where}`: only images are supported")
    url = parsed.url
    if ":" not in url.split("/", 1)[0] and not url.startswith("/"):  # a relative path
        parsed = type(parsed)(parsed.kind, str(Path(url).resolve()), parsed.path)
    return load_media_sync(parsed, _OFFLINE_POLICY)


def _walks_parts(template: str) -> bool:
    """Whether a chat template reads content parts' ``type`` (else it prints content as
    text)."""
    return any(probe in template for probe in ("['type']", '["type"]', ".type"))
