"""Text in and out of a model: encoding, decoding and the chat template.

Encoding and decoding run in Rust (``ferrollm.Detokenizer``, the ``tokenizers`` crate), and the
same ``Detokenizer`` is handed to the scheduler, which streams output text. Chat templates are
Jinja, rendered the way transformers renders them (same environment options, filters and
globals), but inside jinja2's ``ImmutableSandboxedEnvironment``: a template comes from the model
files only, never from a request, and even so it is untrusted code that must not reach Python
internals. Template errors (syntax, ``raise_exception``, undefined values, sandbox violations)
become ``ChatTemplateError``, a ValueError carrying the template's own message.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from ferrollm._core import Detokenizer

if TYPE_CHECKING:
    from ferrollm.executor.source import ModelSource, SpecialTokens

#: One chat message: ``{"role": ..., "content": str | list of parts, ...}``.
Message = Mapping[str, Any]


class ChatTemplateError(ValueError):
    """The chat template failed to compile or render; the message is the template's."""


#: A render that takes longer than this (seconds) is stopped: a template that loops (a
#: ``range`` nested in a ``range``, a recursive macro) ends its request, not the server.
MAX_RENDER_SECONDS = 5.0
#: Characters a render may produce (and any string or list it builds on the way) at most.
MAX_RENDER_CHARS = 32 * 1024 * 1024
#: The largest exponent ``**`` may take (``2 ** 10**9`` would compute for minutes).
_MAX_EXPONENT = 4096


class ChatTemplate:
    """A chat template compiled once; ``render`` is safe to call from any thread.

    ``special_tokens`` (``bos_token``, ``eos_token``, ...) are visible to the template as
    variables, as transformers passes them.
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template does not compile: {e}") from e

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text for ``messages`` (and ``tools``, JSON-schema dicts).

        Raises ChatTemplateError when the template fails (its ``raise_exception`` message
        included) and ValueError for a malformed message.
        """
        _check_messages(messages)
        variables = {
            **self.special_tokens,
            **_plain(template_kwargs),
            "messages": _plain(list(messages)),
            "tools": _plain(None if tools is None else list(tools)),
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        _budget.deadline = time.monotonic() + MAX_RENDER_SECONDS
        try:
            pieces = []
            size = 0
            for piece in self._template.generate(**variables):
                size += len(piece)
                if size > MAX_RENDER_CHARS:
                    raise _too_large(size)
                pieces.append(piece)
            return "".join(pieces)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template error: {e.message or e}") from e
        except (RecursionError, MemoryError) as e:
            raise ChatTemplateError(
                f"chat template error: the template recursed or allocated without bound ({e!r})"
            ) from None
        finally:
            _budget.deadline = None


class Tokenizer:
    """One model's tokenizer: Rust encode/decode plus its chat template (if it has one)."""

    def __init__(
        self,
        detokenizer: Detokenizer,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
        *,
        eos_token_id: int | None = None,
    ) -> None:
        self.detokenizer = detokenizer
        self.eos_token_id = eos_token_id
        self.chat_template = (
            None if chat_template is None else ChatTemplate(chat_template, special_tokens)
        )

    @classmethod
    def from_source(cls, source: ModelSource) -> Tokenizer:
        """The tokenizer of an opened checkpoint (``ferrollm.executor.loader``)."""
        return cls(
            Detokenizer.from_str(source.tokenizer_json),
            source.chat_template,
            special_token_texts(source.special_tokens),
            eos_token_id=source.special_tokens.eos_token_id,
        )

    @property
    def vocab_size(self) -> int:
        """One past the largest token id the tokenizer knows."""
        return self.detokenizer.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` runs the post-processor (BOS, ...)."""
        return self.detokenizer.encode(text, add_special_tokens)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids``."""
        return self.detokenizer.decode(token_ids, skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """Render ``messages`` with the model's chat template (see `ChatTemplate.render`).

        Raises ChatTemplateError if the model has no chat template.
        """
        if self.chat_template is None:
            raise ChatTemplateError(
                "this model has no chat template; send a plain prompt instead of messages"
            )
        return self.chat_template.render(messages, tools, add_generation_prompt, **template_kwargs)

    def encode_chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        """Token ids of the rendered chat.

        No special tokens are added: the template writes its own BOS (as transformers does).
        """
        text = self.apply_chat_template(messages, tools, add_generation_prompt, **template_kwargs)
        return self.encode(text, add_special_tokens=False)


def special_token_texts(tokens: SpecialTokens) -> dict[str, str]:
    """The set special tokens by name (``bos_token`` ...), as templates expect them."""
    names = ("bos_token", "eos_token", "pad_token", "unk_token")
    return {name: text for name in names if (text := getattr(tokens, name)) is not None}


def _check_messages(messages: Sequence[Message]) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"`messages` must be a list of messages; got {type(messages).__name__}")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"`messages[{i}]` must be an object; got {type(message).__name__}")
        if not isinstance(message.get("role"), str):
            raise ValueError(f"`messages[{i}].role` must be a string")


def _plain(value: Any) -> Any:
    """A copy of ``value`` made of JSON types only.

    Whatever the template sees must be inert: objects with methods (even str subclasses) could
    offer the sandbox a way out, and a fresh copy keeps the caller's data untouched.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    # Subclasses (enums, numpy scalars, ...) carry methods of their own: strip them.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask tag): renders
    its body unchanged; serving has no use for the mask."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it as a plain attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore names, which could shadow internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        _tick()
        _check_size(value)  # a string doubled through a namespace in a loop
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template may not set the underscore attribute {name!r} on a namespace"
            )


class _Dict:
    """``dict()`` for templates, without exposing the ``dict`` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' filter: Jinja's own escapes HTML characters, which templates do not want.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Budget(threading.local):
    """The deadline of the render running on this thread (None: none running)."""

    deadline: float | None = None


_budget = _Budget()


def _tick() -> None:
    deadline = _budget.deadline
    if deadline is not None and time.monotonic() > deadline:
        raise ChatTemplateError(
            f"chat template error: rendering took longer than {MAX_RENDER_SECONDS:g} s "
            "(MAX_RENDER_SECONDS); the template loops or does too much work"
        )


def _too_large(size: int) -> ChatTemplateError:
    return ChatTemplateError(
        f"chat template error: the template produced {size} characters or more, past the "
        f"limit of {MAX_RENDER_CHARS} (MAX_RENDER_CHARS)"
    )


def _check_size(value: Any) -> None:
    if isinstance(value, (str, list, tuple, dict)) and len(value) > MAX_RENDER_CHARS:
        raise _too_large(len(value))


class _Range:
    """``range()`` for templates: at most jinja2's ``MAX_RANGE`` items, and each step checks
    the render's deadline (a loop nested in a loop spends its time here)."""

    def __init__(self, *args: int) -> None:
        self._range = safe_range(*args)

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, index: Any) -> Any:
        return self._range[index]

    def __iter__(self) -> Iterator[int]:
        for i in self._range:
            _tick()
            yield i

    def __reversed__(self) -> Iterator[int]:
        for i in reversed(self._range):
            _tick()
            yield i


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with the render's time and size bounds checked on every call, attribute
    and item lookup and arithmetic operation (where a runaway template spends its time), and
    string and list repetition or concatenation refused past ``MAX_RENDER_CHARS`` before it
    allocates."""

    intercepted_binops = frozenset(["*", "+", "**"])

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _tick()
        if operator == "**" and isinstance(right, int) and abs(right) > _MAX_EXPONENT:
            raise ChatTemplateError(
                f"chat template error: the exponent {right} is past {_MAX_EXPONENT}"
            )
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                size = len(seq) * times if isinstance(seq, (str, list)) else 0
                if isinstance(times, int) and size > MAX_RENDER_CHARS:
                    raise _too_large(size)
        sequences = isinstance(left, (str, list)) and isinstance(right, (str, list))
        if operator == "+" and sequences and len(left) + len(right) > MAX_RENDER_CHARS:
            raise _too_large(len(left) + len(right))
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _tick()
        for arg in (*args, *kwargs.values()):  # "x".ljust(10**10) would allocate first
            if isinstance(arg, int) and not isinstance(arg, bool) and arg > MAX_RENDER_CHARS:
                raise _too_large(arg)
        result = super().call(__context, __obj, *args, **kwargs)
        _check_size(result)
        return result

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return super().getitem(obj, argument)


def _environment() -> ImmutableSandboxedEnvironment:
    # The same options, filters and globals as transformers, so templates render identically.
    env = _BoundedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = _Dict()
    env.globals["range"] = _Range
    return env
