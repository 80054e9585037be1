"""`EngineRequest`: one request as the engine takes it, built once and carried unchanged.

The server builds it when the body has been validated and tokenized (arrival stamped when the
HTTP body arrived); the offline `LLM` builds it from a prompt. `AsyncEngine`, the engine loop
and `LLMEngine` pass the same object along, and the scheduler reads its token ids in place.
Times are ``time.perf_counter()`` seconds, the engine's one clock: the scheduler's deadlines
(``timeout_s``) and priority aging count from ``arrival_time``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ferrollm._core import CompiledGrammar, SamplingParams


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """A request for the engine: id, prompt tokens, parameters, arrival and priority."""

    #: Unique among the engine's unfinished requests.
    request_id: str
    #: The prompt's token ids (1-D uint32), read by the scheduler without a copy to a list.
    prompt_token_ids: npt.NDArray[np.uint32]
    params: SamplingParams = field(default_factory=SamplingParams)
    #: ``time.perf_counter()`` when the request arrived (the HTTP body, or the offline call).
    arrival_time: float = field(default_factory=time.perf_counter)
    #: 1 (highest) to 5; None takes ``params.priority``.
    priority: int | None = None
    #: The prompt's text, when known (echoed in outputs).
    prompt: str | None = None
    #: Structured output: the compiled grammar the output must follow (each request follows
    #: its own copy), from ``LLMEngine.grammar_compiler``.
    grammar: CompiledGrammar | None = None
    #: ``time.perf_counter()`` when the request times out; None = arrival +
    #: ``params.timeout_s`` (if set). The server puts its ``--request-timeout`` here.
    deadline: float | None = None
    #: Requests share prefix-cache blocks only with requests of the same salt.
    cache_salt: str | None = None
    #: P-tuning: float ``[rows, hidden_size]``; prompt id ``vocab_size + i`` is embedded as
    #: row ``i`` (the engine salts the prefix cache by the table).
    prompt_table: npt.NDArray[np.floating] | None = None
    #: Keep the model's raw logits at every prompt position (``RequestOutput.logits``).
    return_context_logits: bool = False
    #: Keep the model's raw logits each output token was sampled from.
    return_generation_logits: bool = False

    @classmethod
    def of(
        cls,
        request_id: str,
        prompt_token_ids: Sequence[int] | npt.NDArray[np.integer],
        params: SamplingParams | None = None,
        *,
        priority: int | None = None,
        prompt: str | None = None,
    ) -> EngineRequest:
        """A request from any flat sequence of token ids (checked: integers in [0, 2^32))."""
        return cls(
            request_id,
            token_id_array(prompt_token_ids),
            params if params is not None else SamplingParams(),
            priority=priority,
            prompt=prompt,
        )

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens in the prompt."""
        return int(self.prompt_token_ids.shape[0])


def token_id_array(token_ids: Sequence[int] | npt.NDArray[np.integer]) -> npt.NDArray[np.uint32]:
    """``token_ids`` as a 1-D uint32 array; ValueError naming `prompt_token_ids` otherwise."""
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise ValueError("`prompt_token_ids` must be a flat list of integers")
    if ids.size == 0:
        raise ValueError("`prompt_token_ids` must contain at least 1 token")
    bad = ids[(ids < 0) | (ids > np.iinfo(np.uint32).max)]
    if bad.size:
        raise ValueError(f"`prompt_token_ids` must be token ids in [0, 2^32); got {int(bad[0])}")
    return ids.astype(np.uint32, copy=False)
