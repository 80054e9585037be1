"""Generation logits for beam search (``return_generation_logits`` with ``beam_width`` > 1).

Beams are reordered every step, so the rows the engine computed while searching belong to no
one output sequence. A finished beam's generation logits are instead recomputed: one forward
over the prompt and the beam's tokens (a request for context logits, which skips the prefix
cache), whose rows at the positions that predicted each output token are exactly the logits
that token was chosen from, as TensorRT-LLM returns them. It costs one prefill per beam,
paid only by requests that ask."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ferrollm._core import SamplingParams
from ferrollm.engine.async_engine import AsyncEngine
from ferrollm.engine.outputs import RequestOutput
from ferrollm.engine.request import EngineRequest

#: The scoring request's own output is not used: it asks for the least there is.
_SCORE = SamplingParams(max_tokens=1, temperature=0.0)


async def beam_generation_logits(
    engine: AsyncEngine, searched: EngineRequest, out: RequestOutput, beam_width: int
) -> npt.NDArray[np.float32]:
    """float32 ``[1, beam_width, longest beam, vocab]`` for the beams of ``out``, the output
    of ``searched`` (whose prompt, and prompt table, are scored again), zero-padded past each
    beam's end."""
    prompt = [int(t) for t in searched.prompt_token_ids]
    beams = sorted(out.outputs, key=lambda c: c.index)[:beam_width]
    rows: list[npt.NDArray[np.float32]] = []
    for b, beam in enumerate(beams):
        tokens = list(beam.token_ids)
        if not tokens:
            rows.append(np.zeros((0, 0), dtype=np.float32))
            continue
        ids = np.asarray([*prompt, *tokens[:-1]], dtype=np.uint32)
        score = EngineRequest(
            f"{searched.request_id}-beam{b}",
            ids,
            _SCORE,
            prompt_table=searched.prompt_table,
            return_context_logits=True,
        )
        last: RequestOutput | None = None
        async for last in engine.generate(score):  # noqa: B007 (the last output is the one)
            pass
        assert last is not None and last.logits is not None and last.logits.context is not None
        rows.append(last.logits.context[len(prompt) - 1 :])
    vocab = max((r.shape[1] for r in rows if r.size), default=0)
    width = max((len(r) for r in rows), default=0)
    logits = np.zeros((1, beam_width, width, vocab), dtype=np.float32)
    for b, r in enumerate(rows):
        if r.size:
            logits[0, b, : len(r)] = r
    return logits
