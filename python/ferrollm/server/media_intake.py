"""Media parts on the generation routes (docs/api/common.md#media-parts): the parts of a
validated body read, their media loaded and the prompt expanded by the model's processor.

The validator has already refused media on a text-only model (400 ``unsupported_content_type``
naming the part) and counted the parts against the route's limit, so this module runs only on
a multimodal engine and only for a body that has media. Its work is blocking (fetching, decoding,
the processor's tokenizing and pixel preparation) and runs on worker threads, never on the
event loop; at most `MAX_CONCURRENT_LOADS` parts load at once per server, so a flood of large
images cannot take every worker thread. Each media part stands in the rendered prompt as the
processor's placeholder for its kind (`MultimodalProcessor.placeholder`).

Every failure of a part is a 4xx naming it: `MediaError` carries the part's path, anything else
a decoder raises is turned into one, and the processor's ValueError about ``media[i]`` is said
of the i-th part.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgspec

from ferrollm.media import (
    MediaError,
    MediaItem,
    MediaLimits,
    MediaPart,
    MediaPolicy,
    check_media_count,
    is_media_part,
    load_media,
    parse_media_part,
)
from ferrollm.media.errors import INVALID_MEDIA, UNSUPPORTED_CONTENT_TYPE
from ferrollm.multimodal.inputs import MediaKind, MultimodalProcessor, ProcessedPrompt, audio_rate
from ferrollm.multimodal.templates import template_part
from ferrollm.server.errors import ApiError

logger = logging.getLogger("ferrollm.server")

#: Media parts loading at once per server (each holds a worker thread while it fetches and
#: decodes); the rest wait their turn.
MAX_CONCURRENT_LOADS = 8

#: A processor's error about one item: ``media[i]``.
_ITEM = re.compile(r"media\[(\d+)\]")


@dataclass(frozen=True)
class Segment:
    """One content part as the prompt renders it: a text part's ``text``, or a media part."""

    text: str | None = None
    part: MediaPart | None = None


@dataclass
class LoadedMedia:
    """A request's media parts in prompt order, decoded, and the processor that expands them."""

    processor: MultimodalProcessor
    parts: list[MediaPart]
    items: list[MediaItem]

    def placeholder(self, part: MediaPart) -> str:
        """The text ``part`` stands as in the prompt."""
        return self.processor.placeholder(_kind(part))

    def joined(self, segments: Sequence[Segment]) -> str:
        """``segments`` joined in order with no separator, each media part as its
        placeholder (MindIE's ``text_input``; a chat message's content as a string)."""
        return "".join(self.placeholder(s.part) if s.part else s.text or "" for s in segments)

    def placed(self, prompt: str) -> bool:
        """Whether ``prompt`` has each media part's placeholder exactly as often as there are
        parts of that kind (a chat template may write its own marker, or none)."""
        wanted = Counter(self.placeholder(p) for p in self.parts)
        return all(prompt.count(text) == n for text, n in wanted.items())

    def process(self, prompt: str, *, add_special_tokens: bool = True) -> ProcessedPrompt:
        """``prompt`` expanded by the processor (blocking: run it on a worker thread); its
        ValueError about ``media[i]`` becomes a 400 naming the i-th part. A rendered chat
        passes ``add_special_tokens`` False: its template wrote its own BOS."""
        try:
            return self.processor.process(prompt, self.items, add_special_tokens=add_special_tokens)
        except ValueError as e:
            raise self._item_error(e) from None

    def _item_error(self, error: ValueError) -> ApiError:
        message = str(error)
        match = _ITEM.search(message)
        param = None
        if match is not None and int(match.group(1)) < len(self.parts):
            param = self.parts[int(match.group(1))].path
            message = _ITEM.sub(lambda _: str(param), message, count=1)
        elif self.parts:
            param = self.parts[0].path.rsplit(".", 1)[0].split("[", 1)[0]
        return ApiError(400, message, param=param, code=INVALID_MEDIA)


@dataclass
class ChatMedia(LoadedMedia):
    """A chat request's media: ``segments`` holds, by message index, the content parts of
    each message that has media."""

    segments: dict[int, list[Segment]]

    def template_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` (the validator's, text parts joined) with each message that has media
        holding its parts as one string, each media part as its placeholder where it stood.
        Strings, so the tool-calling rewrites of the history work on them unchanged."""
        return [
            {**m, "content": self.joined(self.segments[i])} if i in self.segments else dict(m)
            for i, m in enumerate(messages)
        ]

    def as_parts(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` for a template that reads typed parts (Hugging Face's multimodal
        templates, which write their own marker for ``{"type": "image"}``): every string
        content split at the placeholders into ``{"type": "text", "text": ...}`` and
        media parts (`template_part`); a message without media becomes one text part, since
        such a template reads every message's content as parts."""
        kinds = {self.placeholder(p): _kind(p) for p in self.parts}
        split = re.compile("(" + "|".join(map(re.escape, sorted(kinds, key=len))) + ")")
        out = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, str):
                pieces = split.split(content)
                content = [
                    {"type": "text", "text": piece} if i % 2 == 0 else template_part(kinds[piece])
                    for i, piece in enumerate(pieces)
                    if piece
                ]
            out.append({**m, "content": content})
        return out


@dataclass
class GenerateMedia(LoadedMedia):
    """A MindIE generate request's media: ``prompt`` is ``text_input``'s parts joined, the
    image as its placeholder (no chat template)."""

    prompt: str


class MediaIntake:
    """A multimodal server's media intake: its processor, where media may come from, and the
    bound on loads in flight. One per server (`ServerContext.media`)."""

    def __init__(self, processor: MultimodalProcessor, policy: MediaPolicy) -> None:
        self.processor = processor
        self.chat_policy = policy.with_limits(MediaLimits.chat())
        self.generate_policy = policy.with_limits(MediaLimits.generate())
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_LOADS)

    @property
    def modalities(self) -> list[str]:
        """What the model takes: "text", then its media kinds (``/v1/models``)."""
        return ["text", *sorted(self.processor.modalities)]

    async def chat(self, messages: Any) -> ChatMedia | None:
        """The media of chat ``messages`` (a validated body's), loaded; None without any."""
        segments: dict[int, list[Segment]] = {}
        parts: list[MediaPart] = []
        for i, message in enumerate(messages or ()):
            content = message.get("content") if isinstance(message, Mapping) else None
            if not isinstance(content, list) or not any(map(is_media_part, content)):
                continue
            where = f"messages[{i}].content"
            segments[i] = self._segments(content, where, self.chat_policy.limits, parts)
        if not parts:
            return None
        items = await self._load(parts, self.chat_policy)
        return ChatMedia(self.processor, parts, items, segments)

    async def generate(self, body: bytes) -> GenerateMedia | None:
        """The media of a MindIE generate body's ``text_input``, loaded; None without any."""
        data = await _decoded(body)
        text_input = data.get("text_input") if isinstance(data, dict) else None
        if not isinstance(text_input, list) or not any(map(is_media_part, text_input)):
            return None
        parts: list[MediaPart] = []
        segments = self._segments(text_input, "text_input", self.generate_policy.limits, parts)
        items = await self._load(parts, self.generate_policy)
        media = GenerateMedia(self.processor, parts, items, "")
        media.prompt = media.joined(segments)
        return media

    def _segments(
        self, content: Sequence[Any], where: str, limits: MediaLimits, parts: list[MediaPart]
    ) -> list[Segment]:
        """The content parts at ``where`` as segments; media parts appended to ``parts`` too.
        A media kind the model does not take is a 400 ``unsupported_content_type`` naming the
        part's ``type`` here, before anything is fetched (the validator knows only whether the
        model takes media at all)."""
        takes = self.processor.modalities
        segments = []
        for j, item in enumerate(content):
            if is_media_part(item):
                part = parse_media_part(item, f"{where}[{j}]", limits)
                if part.kind not in takes:
                    raise MediaError(
                        f"{where}[{j}].type",
                        UNSUPPORTED_CONTENT_TYPE,
                        f"is {part.part_type!r}, which is not supported: the model takes "
                        + ", ".join(self.modalities),
                    )
                parts.append(part)
                segments.append(Segment(part=part))
            elif isinstance(item, Mapping) and item.get("type") == "text":
                segments.append(Segment(text=str(item.get("text", ""))))
        return segments

    async def _load(self, parts: list[MediaPart], policy: MediaPolicy) -> list[MediaItem]:
        """Every part loaded (at most `MAX_CONCURRENT_LOADS` at once across the server); the
        first failure in prompt order is raised."""
        check_media_count(parts, policy.limits)
        results = await asyncio.gather(
            *(self._load_one(part, policy) for part in parts), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return cast("list[MediaItem]", results)

    async def _load_one(self, part: MediaPart, policy: MediaPolicy) -> MediaItem:
        async with self._slots:
            try:
                # Audio decodes straight to the rate the model's features need.
                return await load_media(part, policy, sample_rate=audio_rate(self.processor))
            except MediaError:
                raise
            except (ImportError, MemoryError):
                raise
            except Exception as e:  # a decoder's own failure on hostile bytes
                logger.warning("media part %s failed to decode", part.path, exc_info=e)
                raise MediaError(
                    part.path, INVALID_MEDIA, f"the {part.kind} could not be read: {e}"
                ) from e

    async def process(self, media: LoadedMedia, prompt: str) -> ProcessedPrompt:
        """`LoadedMedia.process` on a worker thread."""
        return await asyncio.to_thread(media.process, prompt)


def _kind(part: MediaPart) -> MediaKind:
    assert part.kind in ("image", "video", "audio")
    return cast(MediaKind, part.kind)


#: Bodies larger than this are decoded on a worker thread (as `routes.common.run_sized`).
_OFF_LOOP_BYTES = 32 * 1024


async def _decoded(body: bytes) -> Any:
    if len(body) > _OFF_LOOP_BYTES:
        return await asyncio.to_thread(msgspec.json.decode, body)
    return msgspec.json.decode(body)
