"""Logprobs in each API's shape: OpenAI chat (SPEC 4.7) and completions (SPEC 5.6)."""

from __future__ import annotations

from collections.abc import Sequence

from ferrollm._core import Detokenizer
from ferrollm.engine import TokenLogprob
from ferrollm.server.protocol.openai import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)


def chat_logprobs(detok: Detokenizer, entries: Sequence[TokenLogprob]) -> ChatLogprobs:
    """One ``content`` entry per token: its text, bytes, logprob and the top alternatives."""

    def top(token_id: int, logprob: float) -> TopLogprob:
        return TopLogprob(detok.token_text(token_id), logprob, list(detok.token_bytes(token_id)))

    return ChatLogprobs(
        [
            ChatTokenLogprob(
                detok.token_text(e.token_id),
                e.logprob,
                list(detok.token_bytes(e.token_id)),
                [top(t, lp) for t, lp in e.top],
            )
            for e in entries
        ]
    )


def completion_logprobs(
    detok: Detokenizer, entries: Sequence[TokenLogprob], offset: int
) -> tuple[CompletionLogprobs, int]:
    """Completions logprobs for ``entries``, whose text starts at character ``offset`` (per
    choice from 0, →A-52); also the offset after them (for the next chunk of a stream).

    ``top_logprobs[i]`` holds the top alternatives plus the chosen token when it is not among
    them, so k or k+1 entries (SPEC 5.6).
    """
    tokens: list[str] = []
    offsets: list[int] = []
    token_logprobs: list[float] = []
    tops: list[dict[str, float]] = []
    for e in entries:
        text = detok.token_text(e.token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        token_logprobs.append(e.logprob)
        # Keyed by text, so tokens that share one (bytes that are each half a character) share
        # an entry: the most probable keeps it, and the chosen token's is its own logprob.
        top: dict[str, float] = {}
        for t, lp in e.top:
            top.setdefault(detok.token_text(t), lp)
        top[text] = e.logprob
        tops.append(top)
    return CompletionLogprobs(offsets, token_logprobs, tokens, tops), offset
