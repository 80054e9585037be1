"""Structured output for the routes: a validated request's grammar (``ValidRequest.grammar``:
``response_format``, vLLM's ``guided_*`` / ``structured_outputs``) compiled off the event loop
and the engine thread, on a worker thread (``GrammarCompiler`` releases the GIL and caches by
grammar text). A grammar that does not compile, or is built to explode, is a 400 naming its
field (a ``ValidationError`` from the compiler)."""

from __future__ import annotations

import asyncio

from ferrollm._core import CompiledGrammar, ValidRequest
from ferrollm.reasoning import ReasoningPlan
from ferrollm.server.context import ServerContext


async def compiled_grammar(
    ctx: ServerContext, valid: ValidRequest, reasoning: ReasoningPlan | None = None
) -> CompiledGrammar | None:
    """The compiled grammar ``valid`` asks for, or None; with ``reasoning`` it holds only the
    answer after the reasoning (docs/api/openai.md#reasoning)."""
    if valid.grammar is None:
        return None
    kind, text, field = valid.grammar
    compiler = ctx.generator.grammar_compiler

    def compiled() -> CompiledGrammar:
        if reasoning is None:
            return compiler.compile(kind, text, field)
        return compiler.compile("lark", reasoning.answer_grammar(kind, text), field)

    return await asyncio.to_thread(compiled)
