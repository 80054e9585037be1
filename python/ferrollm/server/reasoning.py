"""Reasoning output on the chat routes (docs/api/openai.md#reasoning): which parser this server
splits with (``--reasoning-parser``), a request's plan once its prompt is rendered, and the
split of each streamed sequence, whose content then goes on to the tool-call reader."""

from __future__ import annotations

from dataclasses import dataclass, field

from ferrollm.engine import CompletionOutput
from ferrollm.reasoning import (
    ReasoningPiece,
    ReasoningPlan,
    ReasoningStream,
    opened_by_prompt,
    resolve_reasoning_parser,
)
from ferrollm.server.context import ServerContext


def reasoning_plan(ctx: ServerContext, prompt: str) -> ReasoningPlan | None:
    """How a chat whose rendered prompt is ``prompt`` is split (None: this server does not)."""
    template = ctx.tokenizer.chat_template
    parser = resolve_reasoning_parser(
        ctx.config.reasoning_parser, template.source if template else None
    )
    if parser is None:
        return None
    return ReasoningPlan(parser, opened_by_prompt(parser, prompt))


@dataclass
class StreamedReasoning:
    """The reasoning readers of one streamed chat, one per returned sequence, with each
    sequence's reasoning and content so far (MindIE ``fullTextEnabled`` repeats them)."""

    plan: ReasoningPlan
    _streams: dict[int, ReasoningStream] = field(default_factory=dict)
    _totals: dict[int, ReasoningPiece] = field(default_factory=dict)

    def feed(self, c: CompletionOutput) -> ReasoningPiece:
        """What sequence ``c``'s new text adds to its reasoning and to its content."""
        stream = self._streams.setdefault(c.index, self.plan.stream())
        piece = stream.feed(c.new_text, final=c.finish_reason is not None)
        total = self._totals.setdefault(c.index, ReasoningPiece())
        total.reasoning += piece.reasoning
        total.content += piece.content
        return piece

    def total(self, index: int) -> ReasoningPiece:
        """Sequence ``index``'s reasoning and content so far."""
        return self._totals.get(index, ReasoningPiece())
