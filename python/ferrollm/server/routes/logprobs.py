"""Logprobs in each API's shape: OpenAI chat (SPEC 4.7) and completions (SPEC 5.6)."""

from __future__ import annotations

from collections.abc import Sequence

from ferrollm.engine import TokenLogprob
from ferrollm.server.protocol.openai import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)


def chat_logprobs(entries: Sequence[TokenLogprob]) -> ChatLogprobs:
    """One ``content`` entry per token: its text, bytes, logprob and the top alternatives."""
    return ChatLogprobs(
        [
            ChatTokenLogprob(
                e.text,
                e.logprob,
                list(e.token_bytes),
                [
                    TopLogprob(text, lp, list(raw))
                    for (_, lp), text, raw in zip(e.top, e.top_texts, e.top_bytes, strict=True)
                ],
            )
            for e in entries
        ]
    )


def completion_logprobs(
    entries: Sequence[TokenLogprob], offset: int
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
        text = e.text
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        token_logprobs.append(e.logprob)
        # Keyed by text, so tokens that share one (bytes that are each half a character) share
        # an entry: the most probable keeps it, and the chosen token's is its own logprob.
        top: dict[str, float] = {}
        for (_, lp), alt in zip(e.top, e.top_texts, strict=True):
            top.setdefault(alt, lp)
        top[text] = e.logprob
        tops.append(top)
    return CompletionLogprobs(offsets, token_logprobs, tokens, tops), offset
