"""A multimodal engine for the server's media tests without a multimodal model: the session's
tiny text engine behind a proxy whose ``multimodal`` is `FakeProcessor`, which expands each
placeholder into a few copies of one token and records what it was given, and a loopback
http.server that serves media files."""

from __future__ import annotations

import base64
import copy
import dataclasses
import io
import re
import threading
import wave
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ferrollm.engine import AsyncEngine, RequestOutput
from ferrollm.engine.request import EngineRequest
from ferrollm.media import MediaItem
from ferrollm.multimodal.inputs import MediaInput, MediaKind, ProcessedPrompt
from ferrollm.tokenizer import ChatTemplate, Tokenizer

#: Prompt tokens each media item expands to.
TOKENS_PER_ITEM = 5
_PLACEHOLDER = re.compile(r"(<image>|<video>|<audio>)")


@dataclass
class Call:
    """One `FakeProcessor.process` call: the prompt and the media it was given."""

    prompt: str
    media: list[MediaItem]
    token_ids: list[int]
    #: The thread it ran on (never the event loop's).
    thread: int
    #: Whether the prompt's special tokens (BOS) were to be added: False for a rendered chat.
    add_special_tokens: bool = True


@dataclass
class FakeProcessor:
    """Placeholders ``<image>``, ``<video>``, ``<audio>``; each expands to `TOKENS_PER_ITEM`
    copies of one token. ValueError naming ``media[i]`` when the counts disagree."""

    tokenizer: Tokenizer
    calls: list[Call] = field(default_factory=list)
    kinds: frozenset[MediaKind] = frozenset({"image", "video", "audio"})

    @property
    def modalities(self) -> frozenset[MediaKind]:
        return self.kinds

    def placeholder(self, kind: MediaKind) -> str:
        return f"<{kind}>"

    def process(
        self, prompt: str, media: Sequence[MediaItem], *, add_special_tokens: bool = True
    ) -> ProcessedPrompt:
        pieces = _PLACEHOLDER.split(prompt)
        found = len(pieces) // 2
        if found != len(media):
            raise ValueError(
                f"media[{min(found, len(media))}]: the prompt has {found} placeholder(s) for "
                f"{len(media)} item(s)"
            )
        filler = self.tokenizer.encode("x", add_special_tokens=False)[0]
        ids: list[int] = []
        inputs = []
        for i, piece in enumerate(pieces):
            if i % 2 == 0:
                ids += self.tokenizer.encode(piece, add_special_tokens=False) if piece else []
                continue
            kind: MediaKind = piece[1:-1]  # type: ignore[assignment]
            inputs.append(MediaInput(kind, f"d{i}", {}, len(ids), TOKENS_PER_ITEM))
            ids += [filler] * TOKENS_PER_ITEM
        call = Call(prompt, list(media), ids, threading.get_ident(), add_special_tokens)
        self.calls.append(call)
        return ProcessedPrompt(prompt, ids, tuple(inputs))


class MultimodalEngine:
    """``engine`` with ``multimodal`` set (and another chat template, when given): everything
    else is the real engine's."""

    def __init__(
        self, engine: AsyncEngine, processor: FakeProcessor, chat_template: str | None = None
    ) -> None:
        self._engine = engine
        self.multimodal = processor
        if chat_template is not None:
            tokenizer = copy.copy(engine.tokenizer)
            assert engine.tokenizer.chat_template is not None
            special = engine.tokenizer.chat_template.special_tokens
            tokenizer.chat_template = ChatTemplate(chat_template, special)
            self.tokenizer = tokenizer

    def generate(
        self, request: EngineRequest, client_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """The real engine runs the request's tokens (the fake media's placeholder tokens are
        ordinary ids to it); the media itself is the processor's record, not the text
        model's input (it refuses media)."""
        return self._engine.generate(dataclasses.replace(request, media=()), client_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


#: A template that reads typed content parts and writes ``<image>`` for an image part, as
#: SmolVLM's does (every message's content is a list of parts to it).
PARTS_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}:"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png(width: int = 4, height: int = 3) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(out, format="PNG")
    return out.getvalue()


def wav(seconds: float = 0.25, rate: int = 16_000) -> bytes:
    """A quiet 16-bit mono WAV clip."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x01" * int(seconds * rate))
    return out.getvalue()
