"""Structured output for the routes: a validated request's grammar (``ValidRequest.grammar``:
``response_format``, vLLM's ``guided_*`` / ``structured_outputs``) compiled off the event loop
and the engine thread, on a worker thread (``GrammarCompiler`` releases the GIL and caches by
grammar text). A grammar that does not compile, or is built to explode, is a 400 naming its
field (a ``ValidationError`` from the compiler)."""

from __future__ import annotations

import asyncio

from ferrollm._core import CompiledGrammar, ValidRequest
from ferrollm.server.context import ServerContext


async def compiled_grammar(ctx: ServerContext, valid: ValidRequest) -> CompiledGrammar | None:
    """The compiled grammar ``valid`` asks for, or None."""
    if valid.grammar is None:
        return None
    kind, text, field = valid.grammar
    compiler = ctx.generator.grammar_compiler
    return await asyncio.to_thread(compiler.compile, kind, text, field)
