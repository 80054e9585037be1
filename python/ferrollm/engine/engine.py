"""`LLMEngine`: the model, its paged KV cache and the Rust scheduler, one step at a time.

A step is schedule -> run -> update -> deliver: the scheduler plans the step, the runner turns
the plan into logits, the scheduler samples, detokenizes and stop-checks them, and the tracker
turns the columns it returns into per-request outputs. The engine is single-threaded: the
engine loop's thread (``engine/loop.py``) or the offline ``LLM``'s caller drives it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch

from ferrollm._core import SamplingParams, Scheduler, SchedulerConfig, StepPlan
from ferrollm.default_model import default_model_path
from ferrollm.engine.outputs import RequestFailure, RequestOutput, RequestTracker, StepInfo
from ferrollm.executor.kv_cache import KVCache, KVCacheSpec
from ferrollm.executor.loader import ModelSource, load_model_source
from ferrollm.executor.runner import ModelRunner
from ferrollm.executor.sizing import KVCachePlan, plan_kv_cache, resolve_dtype
from ferrollm.models.config import ModelConfig
from ferrollm.models.llama import LlamaForCausalLM
from ferrollm.models.registry import build_model
from ferrollm.platforms import get_platform
from ferrollm.tokenizer import Tokenizer

if TYPE_CHECKING:
    from ferrollm.config import EngineConfig

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
    ) -> None:
        #: The checkpoint's path (a directory or a .gguf file), when loaded from one.
        self.model_path = model_path
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.runner = runner
        self.model_config = model_config
        self._tracker = RequestTracker()

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        """Load the model named by ``config`` (the default model when None) and size its cache."""
        platform = get_platform(config.device)
        config = config.for_platform(platform)
        source = load_model_source(config.model or default_model_path())
        dtype = resolve_dtype(platform, config.dtype)
        model = load_model(source, platform.device, dtype)
        spec = KVCacheSpec(
            source.config.num_hidden_layers,
            source.config.num_key_value_heads,
            source.config.head_dim,
            config.block_size,
            dtype,
        )
        kv_plan = plan_kv_cache(
            model, spec, platform, config, source.config.max_position_embeddings
        )
        kv_cache = KVCache(spec, kv_plan.num_blocks, platform.device)
        runner = ModelRunner(model, kv_cache, platform.device, dtype, platform.attention_backend())
        tokenizer = Tokenizer.from_source(source)
        scheduler = _build_scheduler(config, kv_plan, source.config, tokenizer)
        logger.info(
            "engine ready: model %s on %s in %s; %d KV blocks of %d tokens, max_model_len %d",
            source.path,
            platform.name,
            str(dtype).removeprefix("torch."),
            kv_plan.num_blocks,
            config.block_size,
            kv_plan.max_model_len,
        )
        return cls(tokenizer, scheduler, runner, source.config, model_path=source.path)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | npt.NDArray[np.integer],
        params: SamplingParams | None = None,
        priority: int | None = None,
        *,
        prompt: str | None = None,
    ) -> None:
        """Queue a request. ``prompt`` (its text, when known) is echoed in outputs.

        Raises ValueError (ValidationError naming the field) for a bad request, or
        QueueFullError; nothing is queued then.
        """
        params = params or SamplingParams()
        if request_id in self._tracker:
            raise ValueError(
                f"`request_id` {request_id!r} is already in use by an unfinished request"
            )
        _check_supported(params)
        ids = self._checked_token_ids(prompt_token_ids)
        internal_id = self._tracker.next_id()
        self.scheduler.add_request(internal_id, ids, params, priority=priority)
        self._tracker.add(request_id, internal_id, prompt, ids.tolist(), params)

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
        plan = self.scheduler.schedule()
        try:
            logits = self.runner.run(plan)
            out = self.scheduler.update_with_logits(plan, logits.numpy())
        except Exception as e:
            raise self._fail_step(plan, e) from e
        step = StepInfo(started, time.perf_counter(), plan.num_rows)
        return self._tracker.deliver(plan, out, step)

    def _checked_token_ids(
        self, prompt_token_ids: Sequence[int] | npt.NDArray[np.integer]
    ) -> npt.NDArray[np.int64]:
        ids = np.asarray(prompt_token_ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError("`prompt_token_ids` must be a flat list of integers")
        if ids.size == 0:
            raise ValueError("`prompt_token_ids` must contain at least 1 token")
        # Ids beyond the model's vocabulary are refused by the scheduler (its vocab_size).
        return ids.astype(np.int64, copy=False)

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


def _check_supported(params: SamplingParams) -> None:
    # The scheduler forks `n` sequences; ranking `best_of` candidates and beam search are not
    # built yet, so say so rather than quietly return something else.
    if params.use_beam_search:
        raise ValueError("`use_beam_search` is not supported yet")
    if params.best_of != params.n:
        raise ValueError(
            f"`best_of` ({params.best_of}) other than `n` ({params.n}) is not supported yet"
        )


def load_model(source: ModelSource, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    """Build the model for ``source`` on ``device`` and stream its weights in, one at a time."""
    model = build_model(source.config, device, dtype)
    model.load_weights(source.iter_weights(dtype))
    return model


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
    )
    return Scheduler(scheduler_config, tokenizer.detokenizer)
