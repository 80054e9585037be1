"""The ``/v1`` routes (OpenAI/vLLM with MindIE's extensions, docs/api/openai.md#chat-completions,
docs/api/openai.md#completions): MindIE ids (``endpoint_common_<n>``), timing fields,
``fullTextEnabled``, an early end said by ``err_msg`` on the last chunk, and a stream an error cut
short ending with a "stop" chunk carrying it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ferrollm.server.errors import ApiError
from ferrollm.server.http import sse_event
from ferrollm.server.render.base import Renderer


class OpenAIRenderer(Renderer):
    """``/v1/chat/completions`` and ``/v1/completions``."""

    timings = True
    splits_reasoning = True

    @property
    def full_text(self) -> bool:
        return self.ctx.config.full_text

    @property
    def offsets_across_choices(self) -> bool:
        return self.ctx.config.text_offset_mode == "mindie"

    def new_id(self, kind: str) -> str:
        return self.ctx.next_id()

    def error_event(self, error: ApiError, stop_chunk: Callable[[], msgspec.Struct]) -> bytes:
        chunk: Any = stop_chunk()
        chunk.err_msg = error.message
        return sse_event(msgspec.json.encode(chunk))
