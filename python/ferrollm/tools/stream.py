"""A tool-calling response as it streams: each format reads the whole text so far into a
`Snapshot` (the plain content, then the calls with their names once whole and their
arguments as far as written), and `ToolStream` turns successive snapshots into deltas.

A format's snapshots only grow: each one's content and each call's arguments extend the
previous one's, and a name once given never changes. So the deltas of a stream, joined, are
exactly what one read of the finished text gives (the non-streamed response)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class CallSnapshot:
    """One call as far as written: ``name`` once whole, ``arguments`` (a JSON object's text)
    as far as it is known to belong to them, ``done`` once the call has ended."""

    name: str | None = None
    arguments: str = ""
    done: bool = False


@dataclass
class Snapshot:
    """The text so far, read: content outside the calls (text that could still turn out to
    be the start of a call is held back), then the calls in order."""

    content: str = ""
    calls: list[CallSnapshot] = field(default_factory=list)


class ToolFormatLike(Protocol):
    """What `ToolStream` needs of a format."""

    def scan(self, text: str, final: bool) -> Snapshot: ...


@dataclass
class ToolCall:
    """A parsed call, as the response carries it."""

    id: str
    name: str
    arguments: str


@dataclass
class CallDelta:
    """A streamed piece of call ``index``: its id and name the first time, then arguments."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass
class ToolDelta:
    """What one step adds: content text and call pieces."""

    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)


def new_call_id() -> str:
    """A fresh call id (``call_`` and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolStream:
    """One sequence's output read for tool calls, step by step (`feed`) or at once
    (`feed(text, final=True)`); `result` is the whole reading."""

    def __init__(self, fmt: ToolFormatLike, tool_names: Sequence[str]) -> None:
        self._fmt = fmt
        self._names = set(tool_names)
        self._text = ""
        self._snapshot = Snapshot()
        self._sent_content = 0
        self._sent: list[tuple[str, int]] = []  # per call: (id, arguments characters sent)

    @property
    def has_calls(self) -> bool:
        """Whether a call has begun (its name was given)."""
        return bool(self._sent)

    def feed(self, delta: str, final: bool = False) -> ToolDelta:
        """Read ``delta``, the next piece of the text; ``final`` when the text has ended (what
        was held back as a possible call start is content then)."""
        self._text += delta
        snap = self._fmt.scan(self._text, final)
        self._snapshot = snap
        out = ToolDelta(content=snap.content[self._sent_content :])
        self._sent_content = len(snap.content)
        for index, call in enumerate(snap.calls):
            if call.name is None:
                break  # calls are handed out in order, each once its name is whole
            if index == len(self._sent):
                call_id = new_call_id()
                self._sent.append((call_id, 0))
                out.calls.append(CallDelta(index, call_id, call.name, ""))
            call_id, sent = self._sent[index]
            piece = call.arguments[sent:]
            if not piece:
                continue
            self._sent[index] = (call_id, len(call.arguments))
            if out.calls and out.calls[-1].index == index:
                out.calls[-1].arguments += piece
            else:
                out.calls.append(CallDelta(index, None, None, piece))
        return out

    def result(self) -> tuple[str, list[ToolCall]] | None:
        """The finished text's content and calls; None when a call did not parse (a call cut
        off, an unknown function, arguments that are not a JSON object), in which case the
        response is the plain text (docs/api/openai.md#tools)."""
        calls = []
        for (call_id, _), snap in zip(self._sent, self._snapshot.calls, strict=False):
            if not snap.done or snap.name not in self._names or not _is_object(snap.arguments):
                return None
            calls.append(ToolCall(call_id, snap.name or "", snap.arguments))
        if len(calls) != len(self._snapshot.calls):
            return None
        return self._snapshot.content, calls


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
