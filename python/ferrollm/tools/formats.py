"""How each model family writes tool calls, one `ToolFormat` per family: reading them out of
the text (`scan`, see `stream`), the grammar that makes the model write them (a Lark grammar
for llguidance: `required` and named choices allow only calls, `auto` leaves the text free
until the family's call marker and constrains what follows), and how calls and results are
written into the history for a chat template that does not render tools itself.

Families: Hermes / Qwen2.5 (``<tool_call>{json}</tool_call>``), Llama 3.x JSON (the message
is ``{"name": ..., "parameters": {...}}``), Mistral (``[TOOL_CALLS][{...}, ...]``) and
ChatGLM3 (the function name on the first line, then ``tool_call(key=value, ...)`` in a
Python code block)."""

from __future__ import annotations

from collections.abc import Callable

from ferrollm.tools.chatglm3 import ChatGLM3Format
from ferrollm.tools.format_base import Function, ToolFormat
from ferrollm.tools.hermes import HermesFormat
from ferrollm.tools.llama3 import Llama3JsonFormat
from ferrollm.tools.mistral import MistralFormat

__all__ = [
    "FORMATS",
    "ChatGLM3Format",
    "Function",
    "HermesFormat",
    "Llama3JsonFormat",
    "MistralFormat",
    "ToolFormat",
    "detect_format",
]


FORMATS: dict[str, type[ToolFormat]] = {
    f.name: f for f in (HermesFormat, Llama3JsonFormat, MistralFormat, ChatGLM3Format)
}

#: Template text that tells each family apart, checked in order.
_SIGNS: list[tuple[str, Callable[[str], bool]]] = [
    ("hermes", lambda t: "<tool_call>" in t),
    ("mistral", lambda t: "[TOOL_CALLS]" in t),
    ("llama3_json", lambda t: "<|python_tag|>" in t or ("ipython" in t and "parameters" in t)),
    ("chatglm3", lambda t: "<|observation|>" in t),
]


def detect_format(template: str | None) -> str:
    """The family a chat template writes tool calls in; Hermes when it shows none (the format
    the prompt then teaches, see `ToolFormat.instructions`)."""
    for name, sign in _SIGNS:
        if template is not None and sign(template):
            return name
    return "hermes"
