"""The configuration reference page, generated at build time from the CLI's own definitions.

An MkDocs hook (``hooks:`` in mkdocs.yml): every flag of the ``serve`` parser that
``ferrollm.cli.build_parser()`` builds (its option name, type and help), the default of that
option in ``EngineConfig`` or ``ServerConfig`` and the ``#:`` comment above the field become
one row of ``reference/configuration.md``, so the page cannot drift from the code; a flag whose
option no dataclass has fails the build. Options a config file or ``LLM(**options)`` take but
no flag sets get a table of their own.

Run it alone to print the page: ``PYTHONPATH=python python docs/hooks/config_reference.py``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = "reference/configuration.md"
#: Flags of `ferrollm serve` that are the command's own, not options of a config dataclass.
COMMAND_OPTIONS = frozenset({"config", "log_level"})

HEADER = """\
# Configuration reference

Every option of `ferrollm serve`, generated from the CLI's flag tables (`ferrollm.cli`) and
the option dataclasses (`ferrollm.config.EngineConfig`, `ferrollm.server_config.ServerConfig`)
each time the site is built. The same names work everywhere:

- on the command line as flags: `--max-num-seqs 64`;
- in a `--config FILE.json` object, whose keys mirror the flags (`"max_num_seqs": 64` or
  `"max-num-seqs": 64`); flags given on the command line override the file;
- as keyword arguments of the offline API for the engine options: `LLM(max_num_seqs=64)`.

A default of *None* means the option is worked out at start-up, as its description says
(from the device, the model or another option). Sizes take bytes or a string such as
`"2GiB"` or `"512MB"`. [Serving](../serving.md) explains the options by topic.
"""

FLAGS_NOTE = """\
The help column is the flag's `ferrollm serve --help` line, then the option's documentation
in its dataclass. The option names its dataclass: `EngineConfig` options are the engine's (and
`LLM`'s), `ServerConfig` options the HTTP server's."""


def _import_ferrollm() -> None:
    """Make ``ferrollm`` importable from the source tree when it is not installed."""
    try:
        import ferrollm  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "python"))


def field_comments(cls: type) -> dict[str, str]:
    """Each dataclass field's ``#:`` comment; a field right below another without one of its
    own shares that one (``ssl_certfile`` / ``ssl_keyfile``)."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    comments: dict[str, str] = {}
    previous = ""
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            previous = ""
            continue
        block: list[str] = []
        n = node.lineno - 2  # the line above, 0-based
        while n >= 0 and lines[n].strip().startswith("#:"):
            block.insert(0, lines[n].strip()[2:].strip())
            n -= 1
        previous = " ".join(block) if block else previous
        comments[node.target.id] = previous
    return comments


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        return _value(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return _value(field.default_factory())
    return ""


def _value(value: Any) -> str:
    if value is None:
        return "*None*"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return ", ".join(f"`{v}`" for v in value) if value else "*empty*"
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"`{value}` ({value >> 20} MiB)"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["serve"]  # type: ignore[no-any-return]
    raise ValueError("`ferrollm` has no `serve` command")


def _kind(action: argparse.Action) -> str:
    """How the flag reads its value: a switch, a typed value, repeatable or several values."""
    if isinstance(action, argparse._StoreTrueAction):
        return "switch"
    kind = "path" if action.type is None and not action.option_strings else "str"
    kind = getattr(action.type, "__name__", kind)
    if isinstance(action, argparse._ExtendAction):
        return f"{kind} ..., repeatable"
    if isinstance(action, argparse._AppendAction):
        return f"{kind}, repeatable"
    return kind


def render() -> str:
    """The page's Markdown."""
    _import_ferrollm()
    from ferrollm import cli
    from ferrollm.config import EngineConfig
    from ferrollm.server_config import ServerConfig

    fields: dict[str, tuple[str, dataclasses.Field[Any], str]] = {}
    for cls in (EngineConfig, ServerConfig):
        comments = field_comments(cls)
        for field in dataclasses.fields(cls):
            fields[field.name] = (cls.__name__, field, comments.get(field.name, ""))
    out = [HEADER, "## Flags", "", FLAGS_NOTE, "", "| flag | option | type | default | help |"]
    out.append("|---|---|---|---|---|")
    flagged = set()
    for action in _serve_parser(cli.build_parser())._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = action.option_strings[0] if action.option_strings else action.dest.upper()
        help_text = _cell(action.help or "")
        if action.dest in fields:
            owner, field, comment = fields[action.dest]
            flagged.add(action.dest)
            default = _default(field)
            help_text += f"<br>{_cell(comment)}" if comment else ""
        elif action.dest in COMMAND_OPTIONS:
            owner, default = "the command", _value(action.default)
        else:
            raise ValueError(f"{flag} sets `{action.dest}`, which no config dataclass has")
        option = f"`{action.dest}` ({owner})"
        out.append(f"| `{flag}` | {option} | {_kind(action)} | {default} | {help_text} |")
    out += [
        "",
        "## Options without a flag",
        "",
        "A `--config` file or `LLM(**options)` sets these.",
        "",
        "| option | type | default | description |",
        "|---|---|---|---|",
    ]
    for name, (owner, field, comment) in fields.items():
        if name not in flagged:
            kind = _cell(str(field.type))
            desc = _cell(comment)
            out.append(f"| `{name}` ({owner}) | `{kind}` | {_default(field)} | {desc} |")
    return "\n".join(out) + "\n"


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated page to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    sys.stdout.write(render())
