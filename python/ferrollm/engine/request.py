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
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ferrollm._core import CompiledGrammar, SamplingParams

if TYPE_CHECKING:
    from ferrollm.multimodal.inputs import MediaInput


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
    #: Speculative decoding: a guess of the output's first tokens (1-D uint32; TRT's
    #: ``draft_input_ids``), verified by the model in one step while the output follows it.
    #: The output is the model's whatever the draft: a good draft saves steps.
    draft_tokens: npt.NDArray[np.uint32] | None = None
    #: The drafter's logits at each draft token, float32 ``[len(draft_tokens), vocab]``
    #: (TRT's ``draft_logits``): at temperature > 0 a draft token is then accepted with
    #: probability ``min(1, p/q)`` (q: their softmax); without them the draft counts as
    #: deterministic.
    draft_logits: npt.NDArray[np.float32] | None = None
    #: Requests share prefix-cache blocks only with requests of the same salt.
    cache_salt: str | None = None
    #: P-tuning: float ``[rows, hidden_size]``; prompt id ``vocab_size + i`` is embedded as
    #: row ``i`` (the engine salts the prefix cache by the table).
    prompt_table: npt.NDArray[np.floating] | None = None
    #: Keep the model's raw logits at every prompt position (``RequestOutput.logits``).
    return_context_logits: bool = False
    #: Keep the model's raw logits each output token was sampled from.
    return_generation_logits: bool = False
    #: The LoRA adapter the request runs on, by name (``LLMEngine.lora``); None = the base.
    lora: str | None = None
    #: The prompt's media, ready for the encoder (`ferrollm.multimodal.inputs`); each says
    #: which prompt positions its embeddings fill. Empty for a text prompt.
    media: tuple[MediaInput, ...] = ()

    @classmethod
    def of(
        cls,
        request_id: str,
        prompt_token_ids: Sequence[int] | npt.NDArray[np.integer],
        params: SamplingParams | None = None,
        *,
        priority: int | None = None,
        prompt: str | None = None,
        draft_tokens: Sequence[int] | npt.NDArray[np.integer] | None = None,
        draft_logits: npt.ArrayLike | None = None,
        lora: str | None = None,
    ) -> EngineRequest:
        """A request from any flat sequence of token ids (checked: integers in [0, 2^32)).

        ``draft_logits`` may be a numpy array, a torch tensor (moved to the CPU) or nested
        lists; it is converted to C-contiguous float32.
        """
        return cls(
            request_id,
            token_id_array(prompt_token_ids),
            params if params is not None else SamplingParams(),
            priority=priority,
            prompt=prompt,
            draft_tokens=None
            if draft_tokens is None
            else token_id_array(draft_tokens, "draft_tokens", allow_empty=True),
            draft_logits=None if draft_logits is None else float32_matrix(draft_logits),
            lora=lora,
        )

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens in the prompt."""
        return int(self.prompt_token_ids.shape[0])


def token_id_array(
    token_ids: Sequence[int] | npt.NDArray[np.integer],
    field: str = "prompt_token_ids",
    *,
    allow_empty: bool = False,
) -> npt.NDArray[np.uint32]:
    """``token_ids`` as a 1-D uint32 array; ValueError naming ``field`` otherwise."""
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise ValueError(f"`{field}` must be a flat list of integers")
    if ids.size == 0 and not allow_empty:
        raise ValueError(f"`{field}` must contain at least 1 token")
    bad = ids[(ids < 0) | (ids > np.iinfo(np.uint32).max)]
    if bad.size:
        raise ValueError(f"`{field}` must be token ids in [0, 2^32); got {int(bad[0])}")
    return ids.astype(np.uint32, copy=False)


def float32_matrix(values: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """``values`` (numpy, torch on any device, nested lists) as a C-contiguous 2-D float32
    array; ValueError naming `draft_logits` otherwise."""
    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().to("cpu").float().numpy()
    try:
        array = np.ascontiguousarray(values, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"`draft_logits` must be a [num_draft_tokens, vocab] float array: {e}"
        ) from e
    if array.ndim != 2:
        raise ValueError(
            f"`draft_logits` must be 2-D [num_draft_tokens, vocab]; got shape {array.shape}"
        )
    return array
