"""`LLMEngine`: the model, its paged KV cache and the Rust scheduler, one step at a time.

A step is schedule -> run -> update -> deliver: the scheduler plans the step, the runner turns
the plan into logits, the scheduler samples, detokenizes and stop-checks them, and the tracker
turns the columns it returns into per-request outputs. The engine is single-threaded: the
engine loop's thread (``engine/loop.py``) or the offline ``LLM``'s caller drives it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import numpy.typing as npt

from ferrollm._core import (
    EngineLimits,
    GrammarCompiler,
    NewRequest,
    Scheduler,
    SchedulerConfig,
    StepPlan,
)
from ferrollm.config import DEFAULT_MAX_BEAM_WIDTH, EngineConfigError
from ferrollm.default_model import default_model_path
from ferrollm.distributed.driver import Driver, DriverRunner, start_driver
from ferrollm.engine.build import BuiltRunner, build_runner
from ferrollm.engine.media import check_media, media_spans
from ferrollm.engine.outputs import RequestFailure, RequestOutput, StepInfo
from ferrollm.engine.prompt_tables import table_digest
from ferrollm.engine.request import EngineRequest
from ferrollm.engine.tracker import RequestTracker
from ferrollm.executor.loader import load_model_source
from ferrollm.executor.runner import ModelRunner
from ferrollm.executor.sizing import KVCachePlan, asks_for_block_weights, resolve_dtype
from ferrollm.executor.step_extras import combine_overrides
from ferrollm.lora.manager import LoRAManager, build_lora_manager
from ferrollm.models.config import ModelConfig
from ferrollm.multimodal.build import build_multimodal, install_mrope
from ferrollm.multimodal.encoder_cache import EncoderCache
from ferrollm.multimodal.inputs import MultimodalProcessor, RopePositionsProcessor
from ferrollm.platforms import get_platform
from ferrollm.platforms.host import settle_after_load
from ferrollm.progress import step
from ferrollm.tokenizer import Tokenizer

if TYPE_CHECKING:
    from torch import nn

    from ferrollm.config import EngineConfig
    from ferrollm.executor.source import ModelSource

logger = logging.getLogger("ferrollm.engine")


class StepError(RuntimeError):
    """A step failed as a whole; every request in it was aborted and is named here."""

    def __init__(self, message: str, request_ids: list[str]) -> None:
        super().__init__(message)
        self.request_ids = request_ids


class LLMEngine:
    """Runs requests to completion in continuous batches; not thread-safe (one driver)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        scheduler: Scheduler,
        runner: ModelRunner,
        model_config: ModelConfig,
        *,
        model_path: Path | None = None,
        max_beam_width: int = DEFAULT_MAX_BEAM_WIDTH["cpu"],
    ) -> None:
        #: The checkpoint's path (a directory or a .gguf file), when loaded from one.
        self.model_path = model_path
        #: What a request is admitted against: the widest beam, the model's hidden size.
        self.limits = EngineLimits(
            max_beam_width=max_beam_width, hidden_size=model_config.hidden_size
        )
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.runner = runner
        self.model_config = model_config
        self._tracker = RequestTracker(model_config.vocab_size)
        self._grammar_compiler: GrammarCompiler | None = None
        self._grammar_lock = threading.Lock()
        #: Rank 0's side of the tensor-parallel group (None on one device).
        self.driver: Driver | None = None
        #: The LoRA adapters (``enable_lora``), or None.
        self.lora: LoRAManager | None = None
        #: The prompt processor of an image-text model (``EngineRequest.media`` comes from its
        #: ``process``), or None: the engine takes text only.
        self.multimodal: MultimodalProcessor | None = None
        #: The media encoder's outputs by digest (hits and misses counted), with `multimodal`.
        self.encoder_cache: EncoderCache | None = None

    @property
    def max_beam_width(self) -> int:
        """The widest beam search a request may ask for."""
        return self.limits.max_beam_width

    @property
    def grammar_compiler(self) -> GrammarCompiler:
        """Compiles structured-output grammars for this model's tokenizer (built on first use;
        thread-safe, so the server compiles off the engine thread)."""
        with self._grammar_lock:
            if self._grammar_compiler is None:
                self._grammar_compiler = GrammarCompiler(
                    self.tokenizer.detokenizer, list(self.model_config.eos_token_ids)
                )
            return self._grammar_compiler

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        """Load the model named by ``config`` (the default model when None) and size its cache;
        with ``tensor_parallel_size`` > 1, as rank 0 of the group it forms."""
        platform = get_platform(config.device)
        config = config.for_platform(platform)
        source = load_model_source(config.model or default_model_path(), config.load_format)
        _check_media_options(config, source)
        driver = start_driver(config, platform)
        try:
            tokenizer = Tokenizer.from_source(source)
            # The vision tower first, so the KV cache is sized from the memory it leaves.
            blocks = asks_for_block_weights(config, source.is_quantized)
            dtype = resolve_dtype(platform, config.dtype, block_weights=blocks)
            media = None
            if source.vision_family is not None:
                with step(f"Loading the {source.vision_family} media encoder"):
                    media = build_multimodal(source, tokenizer, platform.device, dtype)
            reserved = 0
            if media is not None:
                reserved = media.encoder_cache.capacity_bytes = config.encoder_cache_bytes
            built = build_runner(config, platform, source, driver, reserved_bytes=reserved)
            if media is not None and media.mrope_section is not None:
                install_mrope(built.runner.model, media.mrope_section)
            scheduler = _build_scheduler(config, built.kv_plan, source.config, tokenizer)
        except BaseException:
            if driver is not None:
                driver.shutdown()
            raise
        if driver is not None:
            driver.start()
        logger.info(
            "engine ready: model %s on %s in %s, weights %s; %d KV blocks of %d tokens, "
            "max_model_len %d; decode %s%s",
            source.path,
            platform.name,
            str(built.runner.dtype).removeprefix("torch."),
            built.quantization or "dense",
            built.kv_plan.num_blocks,
            config.block_size,
            built.kv_plan.max_model_len,
            "eager" if built.compiled is None else f"compiled up to {built.compiled.max_rows} rows",
            "" if driver is None else f", tensor parallel over {config.tensor_parallel_size}",
        )
        assert config.max_beam_width is not None  # for_platform filled it in
        engine = cls(
            tokenizer,
            scheduler,
            built.runner,
            source.config,
            model_path=source.path,
            max_beam_width=config.max_beam_width,
        )
        engine.driver = driver
        if media is not None:
            engine.multimodal, engine.encoder_cache = media.processor, media.encoder_cache
        if config.enable_lora:
            engine.lora = engine._tracker.adapters = _lora_manager(config, built, driver)
        del source  # the open file (a GGUF's mapping) goes before the heap is trimmed
        settle_after_load()
        return engine

    @property
    def fault(self) -> BaseException | None:
        """What broke the engine for good (a tensor-parallel rank died or hung), or None."""
        return None if self.driver is None else self.driver.fault

    def watch_faults(self, callback: Callable[[BaseException], None]) -> None:
        """Call ``callback(fault)`` (from any thread) when `fault` is set."""
        if self.driver is not None:
            self.driver.on_fault = callback

    def shutdown(self) -> None:
        """Release what outlives the engine object: the tensor-parallel workers (idempotent)."""
        if self.driver is not None:
            self.driver.shutdown()

    def add_request(self, request: EngineRequest) -> None:
        """Queue ``request``.

        Raises ValueError (ValidationError naming the field) for a bad request, or
        QueueFullError; nothing is queued then.
        """
        if request.request_id in self._tracker:
            raise ValueError(
                f"`request_id` {request.request_id!r} is already in use by an unfinished request"
            )
        if request.media:
            self._check_media(request)
        table = request.prompt_table
        num_virtual_tokens = self.limits.admit(
            request.params,
            request.return_generation_logits,
            None if table is None else list(table.shape),
        )
        internal_id = self._tracker.next_id()
        lora_id = self._bind_adapter(request, internal_id)
        try:
            self._queue(request, internal_id, num_virtual_tokens, lora_id)
        except BaseException:
            if self.lora is not None:
                self.lora.unbind(internal_id)
            raise
        self._tracker.add(request, internal_id)
        if request.media and isinstance(self.multimodal, RopePositionsProcessor):
            rope = self.multimodal.rope_positions(request.num_prompt_tokens, request.media)
            self._tracker.media.add_rope(internal_id, rope)

    def _check_media(self, request: EngineRequest) -> None:
        """ValueError naming `media` when this engine takes none, or of a kind or at a span
        it cannot use."""
        if self.multimodal is None:
            raise ValueError(
                f"`media`: the model {self.model_config.architecture} takes text only; "
                "this request carries media"
            )
        for i, item in enumerate(request.media):
            if item.kind not in self.multimodal.modalities:
                raise ValueError(f"`media[{i}]`: this model does not take {item.kind} input")
        check_media(request.media, request.num_prompt_tokens)

    def _bind_adapter(self, request: EngineRequest, internal_id: int) -> int:
        """The number of the adapter ``request`` runs on, pinned for it (0: the base)."""
        if request.lora is None:
            return 0
        if self.lora is None:
            raise ValueError(
                f"`lora`: the request asks for LoRA adapter {request.lora!r}, but adapters are "
                "not enabled (`enable_lora`)"
            )
        return self.lora.bind(internal_id, request.lora)

    def _queue(
        self, request: EngineRequest, internal_id: int, num_virtual_tokens: int, lora_id: int
    ) -> None:
        self.scheduler.add_request(
            NewRequest(
                internal_id,
                request.prompt_token_ids,
                request.params,
                priority=request.priority,
                arrival_time=request.arrival_time,
                grammar=request.grammar,
                deadline=request.deadline,
                draft_tokens=request.draft_tokens,
                draft_logits=request.draft_logits,
                cache_salt=self._cache_salt(request, internal_id),
                num_virtual_tokens=num_virtual_tokens,
                lora_id=lora_id,
                media=media_spans(request.media),
            )
        )

    @staticmethod
    def _cache_salt(request: EngineRequest, internal_id: int) -> str | None:
        """The prefix-cache salt: the request's own, the digest of its prompt table (so it
        shares blocks only with requests of that table), and a salt of its own when it keeps
        context logits (a cache hit would skip the positions it keeps). Media need no salt:
        the scheduler mixes each item's digest into the blocks its span overlaps."""
        parts = [request.cache_salt] if request.cache_salt is not None else []
        if request.prompt_table is not None:
            parts.append(table_digest(request.prompt_table))
        if request.return_context_logits:
            parts.append(f"context-logits:{internal_id}")
        return "|".join(parts) if parts else None

    def abort_request(self, request_id: str) -> bool:
        """End a request at the next step (finish reason "abort"); False if it is not live."""
        internal_id = self._tracker.internal_id(request_id)
        return internal_id is not None and self.scheduler.abort_request(internal_id)

    def abort_all(self) -> list[str]:
        """Abort every request and forget it at once (no further outputs); their ids."""
        request_ids = list(self._tracker)
        for request_id in request_ids:
            self.abort_request(request_id)
            self._tracker.remove(request_id)
        return request_ids

    def waiting_order(self) -> list[str]:
        """The waiting requests' ids in the order they would be admitted now (priority with
        aging, then arrival): a request's index is its place in the queue."""
        # The clock requests arrive by (`EngineRequest.arrival_time`), as `step` schedules.
        order = np.asarray(self.scheduler.waiting_order(time.perf_counter()), dtype=np.int64)
        return self._tracker.request_ids(order)

    def stats(self) -> dict[str, int]:
        """The scheduler's counters (``Scheduler.stats()``), with the encoder cache's
        (``encoder_cache_hits`` / ``_misses`` / ``_entries`` / ``_bytes``) on a multimodal
        engine."""
        stats = self.scheduler.stats()
        if self.encoder_cache is not None:
            stats.update(self.encoder_cache.stats())
        return stats

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running."""
        return self.scheduler.has_unfinished_requests()

    @property
    def num_unfinished_requests(self) -> int:
        """Requests added and not yet finished."""
        return len(self._tracker)

    def step(self) -> list[RequestOutput | RequestFailure]:
        """Advance every scheduled request by one step; outputs for those that changed, and a
        `RequestFailure` for each request that failed alone (its batch-mates go on).

        Raises StepError, with the step's requests aborted, if the model or sampling fails.
        """
        started = time.perf_counter()
        plan = self.scheduler.schedule(started)
        try:
            logits = self._run(plan)
            out = self.scheduler.update_with_logits(plan, logits)
        except Exception as e:
            raise self._fail_step(plan, e) from e
        step = StepInfo(started, time.perf_counter(), plan.num_rows)
        return self._tracker.deliver(plan, out, step)

    def _run(self, plan: StepPlan) -> npt.NDArray[np.float32]:
        """The step's logits to sample, with what the requests' books asked of the same
        forward pass (prompt logprobs, kept logits, prompt-table embeddings) recorded."""
        books = self._tracker
        if self.lora is not None:
            self.lora.prepare(plan.lora_ids, plan.cu_seqlens_q)
        targets = books.prompt_logprobs.targets(plan)
        keep = books.logits.context_rows(plan)
        embeds = books.prompt_tables.overrides(plan)
        positions = None
        if books.media and self.encoder_cache is not None:
            embeds = combine_overrides(embeds, books.media.overrides(plan, self.encoder_cache))
            positions = books.media.rope_positions(plan)
        if targets is None and embeds is None and positions is None and not books.logits:
            return self.runner.run(plan).numpy()  # the common step: nothing else asked
        logits = self.runner.run(
            plan, targets, embeds=embeds, keep_logits=keep, positions=positions
        ).numpy()
        if targets is not None:
            books.prompt_logprobs.record(targets)
        books.logits.record(plan, keep, logits)
        return logits

    def _fail_step(self, plan: StepPlan, error: Exception) -> StepError:
        in_step = np.concatenate([plan.req_ids, plan.finished_req_ids])
        request_ids = self._tracker.request_ids(in_step)
        for request_id in request_ids:
            self.abort_request(request_id)
            self._tracker.remove(request_id)
        logger.exception("step %d failed; aborted %d requests", plan.step_id, len(request_ids))
        return StepError(
            f"the model step failed ({type(error).__name__}: {error}); "
            f"its {len(request_ids)} requests were aborted",
            request_ids,
        )


def _check_media_options(config: EngineConfig, source: ModelSource) -> None:
    """A media model runs on one device (the encoder and the media overrides are not carried
    to tensor-parallel workers); the encoder cache's option needs a media model."""
    if source.vision_family is None and config.encoder_cache_memory is not None:
        raise EngineConfigError(
            "encoder_cache_memory",
            "`encoder_cache_memory` applies to a model that takes media (images, video or "
            "audio); this one takes text only",
        )
    if source.vision_family is not None and config.tensor_parallel_size > 1:
        raise EngineConfigError(
            "tensor_parallel_size",
            f"`tensor_parallel_size` {config.tensor_parallel_size}: image-text models "
            f"({source.vision_family}) run on one device only",
        )


def _lora_manager(config: EngineConfig, built: BuiltRunner, driver: Driver | None) -> LoRAManager:
    """The engine's adapters; in a tensor-parallel group the workers fill their slots as rank
    0 fills its own, and each step carries its tokens' slots (`DriverRunner.lora`)."""
    runner = built.runner
    assert built.lora is not None  # build_runner attached the slots (enable_lora)
    model = cast("nn.Module", runner.model)  # a CausalLM is a module
    on_slot = None if driver is None else driver.load_lora_slot
    manager = build_lora_manager(model, built.lora, config, on_slot)
    if isinstance(runner, DriverRunner):
        runner.lora = manager.state
    return manager


def _build_scheduler(
    config: EngineConfig, kv_plan: KVCachePlan, model_config: ModelConfig, tokenizer: Tokenizer
) -> Scheduler:
    if config.max_num_batched_tokens is None:
        raise ValueError("the scheduler needs EngineConfig.for_platform(platform) first")
    scheduler_config = SchedulerConfig(
        num_blocks=kv_plan.num_blocks,
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=kv_plan.max_model_len,
        max_num_waiting=config.max_num_waiting,
        enable_prefix_caching=config.enable_prefix_caching,
        priority_aging_s=config.priority_aging_s,
        eos_token_ids=model_config.eos_token_ids,
        logprobs_mode=config.logprobs_mode,
        vocab_size=model_config.vocab_size,
        seed=config.seed,
        speculative=config.speculative,
        num_speculative_tokens=config.num_speculative_tokens,
        ngram_min=config.ngram_min,
        ngram_max=config.ngram_max,
        max_loras=config.max_loras if config.enable_lora else 0,
        max_num_encoder_tokens=config.max_num_encoder_tokens,
    )
    return Scheduler(scheduler_config, tokenizer.detokenizer)
