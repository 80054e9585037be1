"""Logprobs in each API's shape: OpenAI chat (docs/api/openai.md#chat-logprobs) and completions
(docs/api/openai.md#completions-logprobs), and the prompt's: completions ``echo`` and vLLM's
``prompt_logprobs``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ferrollm.engine import PromptLogprob, TokenLogprob
from ferrollm.server.protocol.openai import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    PromptLogprobs,
    PromptTokenLogprob,
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
    choice from 0, docs/decisions.md#text-offsets-across-choices); also the offset after them (for
    the next chunk of a stream).

    ``top_logprobs[i]`` holds the top alternatives plus the chosen token when it is not among
    them, so k or k+1 entries (docs/api/openai.md#completions-logprobs).
    """
    tokens: list[str] = []
    offsets: list[int] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
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


def prompt_completion_logprobs(
    token_ids: Sequence[int],
    scores: Sequence[PromptLogprob | None],
    k: int,
    text_of: Callable[[int], str],
) -> tuple[CompletionLogprobs, int]:
    """The prompt's tokens in completions logprobs (``echo``), offsets from 0: the first token
    has a null logprob and null alternatives; the others their ``k`` best alternatives plus
    themselves (docs/api/openai.md#completions-logprobs). Also the offset after them, where the
    completion's tokens start."""
    tokens: list[str] = []
    offsets: list[int] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offset = 0
    for token_id, entry in zip(token_ids, scores, strict=True):
        text = text_of(token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            token_logprobs.append(None)
            tops.append(None)
            continue
        token_logprobs.append(entry.logprob)
        top: dict[str, float] = {}
        for alt, lp in entry.top[:k]:
            top.setdefault(text_of(alt), lp)
        top[text] = entry.logprob
        tops.append(top)
    return CompletionLogprobs(offsets, token_logprobs, tokens, tops), offset


def joined(first: CompletionLogprobs, then: CompletionLogprobs) -> CompletionLogprobs:
    """``first``'s tokens followed by ``then``'s (the prompt's, then the completion's)."""
    return CompletionLogprobs(
        first.text_offset + then.text_offset,
        first.token_logprobs + then.token_logprobs,
        first.tokens + then.tokens,
        first.top_logprobs + then.top_logprobs,
    )


def vllm_prompt_logprobs(
    scores: Sequence[PromptLogprob | None], k: int, text_of: Callable[[int], str]
) -> PromptLogprobs:
    """vLLM's ``prompt_logprobs``: per prompt token null (the first) or token id -> score, for
    the prompt's own token and its ``k`` best alternatives."""
    out: PromptLogprobs = []
    for entry in scores:
        if entry is None:
            out.append(None)
            continue
        own = PromptTokenLogprob(entry.logprob, entry.rank, text_of(entry.token_id))
        ranked = {str(entry.token_id): own}
        for rank, (alt, lp) in enumerate(entry.top[:k], start=1):
            ranked.setdefault(str(alt), PromptTokenLogprob(lp, rank, text_of(alt)))
        out.append(ranked)
    return out
