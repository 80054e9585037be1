"""Reasoning output (docs/api/openai.md#reasoning): a thinking model's ``<think>`` ...
``</think>`` text split from its answer, as vLLM's ``deepseek_r1`` and ``qwen3`` reasoning
parsers split it, whole or as it streams; and a structured-output grammar moved past the
reasoning, so that it holds the answer only.

Both parsers read one state machine over the output (`ReasoningStream`):

* an output that begins with ``<think>`` opens its reasoning (the tag itself is dropped);
  otherwise it is open from the start when the prompt left a ``<think>`` open (the template
  wrote it), and always with ``deepseek_r1`` (whose templates do; vLLM reads everything before
  ``</think>`` as reasoning there);
* open reasoning runs to the first ``</think>``; what follows is the content (null when empty);
* reasoning never closed is all reasoning, with null content, under both parsers. vLLM's
  ``qwen3`` calls such an output content when whole but streams it as reasoning; the stream's
  reading is kept so that a streamed and a whole response always agree;
* an output whose reasoning never opened (``qwen3`` with ``enable_thinking: false``) is all
  content, with null reasoning.

Streamed, text that may still be a tag (``</thi``) waits until it is decided, so no delta
carries part of a tag, and the pieces joined are exactly the whole split.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

#: ``--reasoning-parser`` values: a parser, "auto" (from the chat template) or "none".
REASONING_PARSERS = ("auto", "none", "deepseek_r1", "qwen3")
THINK_START = "<think>"
THINK_END = "</think>"

_START, _REASONING, _CONTENT = "start", "reasoning", "content"


def resolve_reasoning_parser(option: str, template: str | None) -> str | None:
    """The parser ``--reasoning-parser option`` means for a model with chat ``template``
    (None: no split). "auto" picks ``qwen3`` for a template that writes ``<think>`` and reads
    ``enable_thinking`` (Qwen3's switch), ``deepseek_r1`` for one that writes ``<think>``
    without it, and none otherwise."""
    if option == "none":
        return None
    if option != "auto":
        return option
    if template is None or THINK_START not in template:
        return None
    return "qwen3" if "enable_thinking" in template else "deepseek_r1"


def opened_by_prompt(parser: str, prompt: str) -> bool:
    """Whether the output starts inside its reasoning when it does not write ``<think>``:
    always for ``deepseek_r1``; for ``qwen3`` when the rendered ``prompt`` left a ``<think>``
    open (a thinking-only template), not when it closed one (``enable_thinking: false``)."""
    if parser == "deepseek_r1":
        return True
    return prompt.rfind(THINK_START) > prompt.rfind(THINK_END)


@dataclass(frozen=True)
class ReasoningPlan:
    """How one request's outputs are split: the ``parser`` and whether the prompt left the
    reasoning open."""

    parser: str
    opened: bool

    def stream(self) -> ReasoningStream:
        """A reader for one sequence's output."""
        return ReasoningStream(self.opened)

    def split(self, text: str) -> tuple[str | None, str | None]:
        """A finished output's ``(reasoning, content)``."""
        stream = self.stream()
        stream.feed(text, final=True)
        return stream.result()

    def answer_grammar(self, kind: str, text: str) -> str:
        """A Lark grammar (llguidance's dialect) that lets the reasoning run free and holds
        what follows ``</think>`` (after any whitespace) to the grammar of ``kind`` and
        ``text`` (``GrammarCompiler.compile``'s arguments). An output whose reasoning can not
        open (``qwen3``, closed by the prompt) may skip it: then the answer starts at once."""
        think = r"/(?s:.*?)<\/think>/"
        if self.opened:
            start = "start: think ANSWER_SPACE answer"
        else:
            start = "start: (OPEN think ANSWER_SPACE)? answer"
        return "\n".join(
            [
                start,
                f"think[lazy]: {think}",
                f"OPEN: {json.dumps(THINK_START)}",
                r"ANSWER_SPACE: /[ \t\r\n]*/",
                f"answer: {_answer_rule(kind, text)}",
            ]
        )


def _answer_rule(kind: str, text: str) -> str:
    """The right-hand side of a Lark rule for a grammar of ``kind``."""
    if kind == "json_object":
        return "%json " + json.dumps({"type": "object", "x-guidance": _JSON_OPTIONS})
    if kind == "json_schema":
        schema = json.loads(text)
        if isinstance(schema, dict):
            schema = {"x-guidance": _JSON_OPTIONS, **schema}
        return "%json " + json.dumps(schema)
    if kind == "regex":
        return "/" + _slashes_escaped(text) + "/"
    if kind == "choice":
        return " | ".join(json.dumps(choice) for choice in json.loads(text))
    return "%lark {\n" + text + "\n}"


def _slashes_escaped(regex: str) -> str:
    """``regex`` as the body of a Lark ``/.../`` literal: each ``/`` not already escaped gets
    a backslash, and a line break is written ``\\n`` (the regex matches the same text)."""
    out = []
    escaped = False
    for ch in regex:
        if ch in "\r\n":
            out.append("\\n" if ch == "\n" else "\\r")
            escaped = False
            continue
        if ch == "/" and not escaped:
            out.append("\\")
        out.append(ch)
        escaped = ch == "\\" and not escaped
    return "".join(out)


#: The JSON layout ``GrammarCompiler`` holds schemas to (rust/grammar/mod.rs, kept equal).
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass
class ReasoningPiece:
    """What one step of a stream adds to the reasoning and to the content."""

    reasoning: str = ""
    content: str = ""


@dataclass
class ReasoningStream:
    """One sequence's output split as it arrives (`feed`); `result` is the whole split."""

    opened: bool
    _state: str = _START
    _pending: str = ""
    _reasoning: list[str] = field(default_factory=list)
    _content: list[str] = field(default_factory=list)
    _has_reasoning: bool = False

    def feed(self, delta: str, final: bool = False) -> ReasoningPiece:
        """Read ``delta``, the next piece of the output; ``final`` when the output has ended
        (text held back as a possible tag is then what it is)."""
        text = self._pending + delta
        self._pending = ""
        piece = ReasoningPiece()
        if self._state == _START:
            if text.startswith(THINK_START):
                text = text[len(THINK_START) :]
                self._open()
            elif THINK_START.startswith(text) and not final:
                self._pending = text
                return piece
            elif self.opened:
                self._open()
            else:
                self._state = _CONTENT
        if self._state == _REASONING:
            end = text.find(THINK_END)
            if end < 0:
                keep = 0 if final else _partial_suffix(text, THINK_END)
                piece.reasoning = text[: len(text) - keep]
                self._pending = text[len(text) - keep :]
                text = ""
            else:
                piece.reasoning = text[:end]
                text = text[end + len(THINK_END) :]
                self._state = _CONTENT
        piece.content = text
        self._reasoning.append(piece.reasoning)
        self._content.append(piece.content)
        return piece

    def _open(self) -> None:
        self._state = _REASONING
        self._has_reasoning = True

    def result(self) -> tuple[str | None, str | None]:
        """``(reasoning, content)`` of what was fed: reasoning None when it never opened;
        content None when reasoning took the whole output (vLLM's ``content or None``)."""
        content = "".join(self._content)
        if not self._has_reasoning:
            return None, content
        return "".join(self._reasoning), content or None


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag``."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
