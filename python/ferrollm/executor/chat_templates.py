"""Built-in chat templates, for GGUF files of a family whose files often carry none.

A GGUF's chat template is ``tokenizer.chat_template``, copied from the model's
``tokenizer_config.json`` by llama.cpp's converter, but quantizers often publish files without
it (Gemma 3 270M's Q4_K_M, for one). The model still expects its family's turn format, so
`builtin_chat_template` supplies it by ``general.architecture``, and says so once in the log.

The templates are ours, written from each family's documented prompt format, and render what
the family's official template renders for the conversations it accepts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

#: Gemma's turns are ``<start_of_turn>{role}\n{text}<end_of_turn>\n``, the role ``user`` or
#: ``model``, after ``<bos>``; the text of a turn is trimmed. Gemma has no system role: a system
#: message's text and a blank line open the first turn. Roles after it alternate, user first.
GEMMA_CHAT_TEMPLATE = r"""{{- bos_token -}}
{%- if messages and messages[0].role == 'system' -%}
  {%- set system = messages[0].content -%}
  {%- if system is not string -%}
    {%- set system = system | selectattr('type', 'equalto', 'text') | map(attribute='text')
                            | join('') -%}
  {%- endif -%}
  {%- set preamble = system ~ '\n\n' -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set preamble = '' -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
  {%- if (message.role == 'user') != (loop.index0 is even) -%}
    {{- raise_exception('Gemma turns alternate user and assistant, starting with user (after '
                        ~ 'an optional system message); message ' ~ loop.index0 ~ ' is '
                        ~ message.role) -}}
  {%- endif -%}
  {%- if message.content is string -%}
    {%- set text = message.content | trim -%}
  {%- elif message.content is iterable and message.content is not mapping -%}
    {%- set text = message.content | selectattr('type', 'equalto', 'text')
                                   | map(attribute='text') | map('trim') | join('') -%}
  {%- else -%}
    {{- raise_exception('Gemma turns take text content (a string or a list of text parts)') -}}
  {%- endif -%}
  {{- '<start_of_turn>' ~ ('model' if message.role == 'assistant' else message.role) ~ '\n' -}}
  {{- (preamble if loop.first else '') ~ text ~ '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<start_of_turn>model\n' -}}
{%- endif -%}"""

#: GLM's turns (ChatGLM3, GLM-4) follow a ``[gMASK]`` and the start token: ``<|{role}|>``, a
#: newline (ChatGLM3: and a space), the text, nothing to close it; the answer is opened by
#: ``<|assistant|>`` (GLM-4: and a newline), and ends where the model opens the next turn. A
#: tool's answer is GLM's ``observation`` turn. (llama.cpp's built-in "chatglm3"/"chatglm4".)
_GLM_CHAT_TEMPLATE = r"""{{- '[gMASK]@START@' -}}
{%- for message in messages -%}
  {%- set role = 'observation' if message.role == 'tool' else message.role -%}
  {%- if message.content is string -%}
    {%- set text = message.content -%}
  {%- elif message.content is iterable and message.content is not mapping -%}
    {%- set text = message.content | selectattr('type', 'equalto', 'text')
                                   | map(attribute='text') | join('') -%}
  {%- else -%}
    {%- set text = '' -%}
  {%- endif -%}
  {{- '<|' ~ role ~ '|>@TURN@' ~ text -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|assistant|>@ANSWER@' -}}
{%- endif -%}"""
CHATGLM3_CHAT_TEMPLATE = (
    _GLM_CHAT_TEMPLATE.replace("@START@", "sop").replace("@TURN@", r"\n ").replace("@ANSWER@", "")
)
GLM4_CHAT_TEMPLATE = (
    _GLM_CHAT_TEMPLATE.replace("@START@", "<sop>")
    .replace("@TURN@", r"\n")
    .replace("@ANSWER@", r"\n")
)

#: ``general.architecture`` (or `_family`'s refinement of it) -> (the family's name in the
#: log, its template).
BUILTIN_CHAT_TEMPLATES: Mapping[str, tuple[str, str]] = {
    "gemma": ("gemma", GEMMA_CHAT_TEMPLATE),
    "gemma2": ("gemma", GEMMA_CHAT_TEMPLATE),
    "gemma3": ("gemma", GEMMA_CHAT_TEMPLATE),
    "chatglm3": ("chatglm3", CHATGLM3_CHAT_TEMPLATE),
    "chatglm4": ("chatglm4", GLM4_CHAT_TEMPLATE),
}


def _family(meta: Mapping[str, Any]) -> str:
    # One "chatglm" architecture, two turn formats: ChatGLM3's vocabulary spells its start
    # token "sop", GLM-4's "<sop>".
    arch = str(meta.get("general.architecture"))
    if arch != "chatglm":
        return arch
    return "chatglm4" if "<sop>" in meta.get("tokenizer.ggml.tokens", ()) else "chatglm3"


def builtin_chat_template(meta: Mapping[str, Any]) -> str | None:
    """The built-in chat template for a GGUF's ``general.architecture`` (None if there is none).

    Call it only for a file without ``tokenizer.chat_template``: it logs that it is used.
    """
    found = BUILTIN_CHAT_TEMPLATES.get(_family(meta))
    if found is None:
        return None
    family, template = found
    logger.info("no chat template in the file; using the built-in %s template", family)
    return template
