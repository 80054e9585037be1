"""Tool calling: the families' call formats (`formats`), reading calls out of a streamed or
finished text (`stream`), and one request's plan: what the template gets, the grammar that
enforces ``tool_choice``, and the readers (`plan`)."""

from ferrollm.tools.formats import FORMATS, Function, ToolFormat, detect_format
from ferrollm.tools.plan import (
    PARSER_CHOICES,
    ToolPlan,
    ToolPlanError,
    history_messages,
    plan_tools,
    resolve_parser,
)
from ferrollm.tools.stream import CallDelta, ToolCall, ToolDelta, ToolStream

__all__ = [
    "FORMATS",
    "PARSER_CHOICES",
    "CallDelta",
    "Function",
    "ToolCall",
    "ToolDelta",
    "ToolFormat",
    "ToolPlan",
    "ToolPlanError",
    "ToolStream",
    "detect_format",
    "history_messages",
    "plan_tools",
    "resolve_parser",
]
