"""`Executor`: the in-flight-batching manager of the TensorRT-LLM-style API (GptManager's
mould, docs/api/trt.md#executor): ``enqueue`` an `InferenceRequest`, get its uint64 id, and receive
named output tensors through ``send_response_callback(request_id, tensors, is_final, err_msg)``,
``await_responses`` or a per-request iterator.

The Executor is a client of an `AsyncEngine`: its requests go to the same engine thread, in
the same batches, as the HTTP server's, so an Executor and a server can share one engine. It
submits on the engine's event loop (the server's, once the server has used the engine; else
one it starts on a thread of its own) and builds each response there, once per engine step.
A bad request, a failed step or a dead engine ends that request with a final response whose
``err_msg`` says why; nothing raises on the engine thread or the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ferrollm._core import Limits
from ferrollm.engine.async_engine import AsyncEngine
from ferrollm.engine.engine import LLMEngine
from ferrollm.engine.loop import Delivery
from ferrollm.engine.outputs import RequestFailure, RequestOutput
from ferrollm.engine.request import EngineRequest
from ferrollm.lora.adapter import LoRAError
from ferrollm.lora.trt_rows import adapter_from_trt_rows
from ferrollm.trt.beam_logits import beam_generation_logits

if TYPE_CHECKING:
    from torch import nn
from ferrollm.trt.request import InferenceRequest
from ferrollm.trt.response import (
    InferenceResponse,
    ResponseShape,
    empty_stream_tensors,
    final_tensors,
    stream_tensors,
)

logger = logging.getLogger("ferrollm.trt")

#: ``send_response_callback(request_id, tensors, is_final, err_msg)`` (docs/api/trt.md#executor).
SendResponseCallback = Callable[[int, Mapping[str, Any], bool, str], None]

UINT64_MAX = (1 << 64) - 1
#: Draft tokens need speculative decoding in the scheduler and sampler.


@dataclass(slots=True)
class _InFlight:
    engine_id: str
    shape: ResponseShape
    num_sent: int = 0
    #: Beam search asking for generation logits: its engine request, whose prompt (and prompt
    #: table) recompute them per finished beam.
    rescore: EngineRequest | None = None


class Executor:
    """Runs `InferenceRequest`s on an engine shared with anything else that uses it.

    ``model_or_engine`` is an `AsyncEngine` (shared), an `LLMEngine`, an ``LLM`` (its
    engine), or a model path (None: the default model) loaded with ``engine_options``. With
    ``send_response_callback``, every response goes to it (called on the engine's event loop:
    it must return quickly); otherwise responses wait for ``await_responses`` or
    ``responses(request_id)``.
    """

    def __init__(
        self,
        model_or_engine: Any = None,
        *,
        send_response_callback: SendResponseCallback | None = None,
        event_loop: asyncio.AbstractEventLoop | None = None,
        **engine_options: Any,
    ) -> None:
        self.engine = _async_engine(model_or_engine, engine_options)
        #: Whether this Executor made the engine (and so shuts it down).
        self._owns_engine = self.engine is not model_or_engine
        self._callback = send_response_callback
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._loop = self.engine.event_loop or event_loop or self._start_own_loop()
        self.limits = _limits(self.engine)
        self._tag = f"trt-{id(self):x}"
        self._next_id = itertools.count(1)
        self._lock = threading.Condition()
        self._in_flight: dict[int, _InFlight] = {}
        self._ready: deque[InferenceResponse] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # --- requests ----------------------------------------------------------------------------

    def enqueue(self, request: InferenceRequest) -> int:
        """Queue ``request``; its id (``request.request_id``, else a fresh one). A request the
        engine cannot run gets one final response with ``err_msg`` (naming the tensor)."""
        with self._lock:
            request_id = self._claim_id(request.request_id)
        if self._closed:
            self._finish_early(request_id, "the executor was shut down")
            return request_id
        try:
            engine_request, shape = self._engine_request(request, request_id)
        except ValueError as e:
            self._finish_early(request_id, str(e))
            return request_id
        with self._lock:
            rescore = engine_request if shape.generation_logits and shape.beam_width > 1 else None
            self._in_flight[request_id] = _InFlight(engine_request.request_id, shape, 0, rescore)
        sink = self._sink(request_id)
        try:
            self._loop.call_soon_threadsafe(self.engine.attach, engine_request, sink)
        except RuntimeError:  # the loop was closed: whoever ran the engine has stopped
            self._finish_early(request_id, "the engine's event loop is closed")
        return request_id

    def cancel(self, request_id: int) -> bool:
        """End a request at the next engine step (its final response follows); False when it
        is not in flight."""
        with self._lock:
            state = self._in_flight.get(request_id)
        if state is None:
            return False
        self._loop.call_soon_threadsafe(self.engine.detach, state.engine_id)
        return True

    def await_responses(
        self, request_id: int | None = None, timeout: float | None = None
    ) -> list[InferenceResponse]:
        """The responses ready now (of ``request_id``, or of any request), waiting up to
        ``timeout`` seconds (None: forever) for at least one; [] on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                taken = self._take(request_id)
                if taken:
                    return taken
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return []
                self._lock.wait(left)

    def responses(
        self, request_id: int, timeout: float | None = None
    ) -> Iterator[InferenceResponse]:
        """Request ``request_id``'s responses as they come, up to its final one (streaming:
        one token each). Raises TimeoutError when none comes within ``timeout`` seconds."""
        while True:
            batch = self.await_responses(request_id, timeout)
            if not batch:
                raise TimeoutError(f"no response for request {request_id} in {timeout} s")
            yield from batch
            if batch[-1].is_final:
                return

    def generate(
        self, request: InferenceRequest, timeout: float | None = None
    ) -> InferenceResponse:
        """Run ``request`` (not streaming) and return its final response."""
        return list(self.responses(self.enqueue(request), timeout))[-1]

    @property
    def num_in_flight(self) -> int:
        """Requests enqueued whose final response has not been made yet."""
        with self._lock:
            return len(self._in_flight)

    def shutdown(self) -> None:
        """Shut down the engine if this Executor made it (a shared `AsyncEngine` belongs to
        its owner), and stop the event loop if this Executor started it."""
        self._closed = True
        if self._owns_engine:
            self.engine.shutdown()
        if self._own_loop is not None:
            self._own_loop.call_soon_threadsafe(self._own_loop.stop)

    # --- internals ---------------------------------------------------------------------------

    def _claim_id(self, wanted: int | None) -> int:
        if wanted is None:
            while (candidate := next(self._next_id) & UINT64_MAX) in self._in_flight:
                pass
            return candidate
        if not isinstance(wanted, (int, np.integer)) or not 0 <= int(wanted) <= UINT64_MAX:
            raise ValueError(f"`request_id` must be a uint64; got {wanted!r}")
        if int(wanted) in self._in_flight:
            raise ValueError(f"`request_id` {wanted} is already in flight")
        return int(wanted)

    def _engine_request(
        self, request: InferenceRequest, request_id: int
    ) -> tuple[EngineRequest, ResponseShape]:
        """The engine request and the response shape; ValueError naming the tensor."""
        valid, tensors = request.checked(self.limits)

        def value(name: str, default: int) -> int:
            return int(tensors[name][0]) if name in tensors else default

        beam_width = value("beam_width", 1)
        shape = ResponseShape(
            beam_width=beam_width,
            streaming=bool(value("streaming", 0)) and beam_width == 1,
            pad_id=value("pad_id", value("end_id", -1)),
            log_probs=bool(value("return_log_probs", 0)),
            context_logits=bool(value("return_context_logits", 0)),
            generation_logits=bool(value("return_generation_logits", 0)),
        )
        table = tensors.get("prompt_embedding_table")
        if table is not None and "prompt_vocab_size" in tensors:
            table = table[: int(tensors["prompt_vocab_size"][0])]
        grammar = None
        if valid.grammar is not None:  # compiled here, on the caller's thread
            grammar = self.engine.grammar_compiler.compile(*valid.grammar)
        engine_request = EngineRequest(
            f"{self._tag}-{request_id}",
            tensors["input_ids"][0].astype(np.uint32),
            valid.params,
            prompt_table=table,
            return_context_logits=shape.context_logits,
            # Beam search's are recomputed per finished beam (`beam_logits`).
            return_generation_logits=shape.generation_logits and shape.beam_width == 1,
            draft_tokens=_draft_tokens(tensors.get("draft_input_ids")),
            draft_logits=tensors.get("draft_logits"),
            grammar=grammar,
            lora=self._adapter(tensors),
        )
        return engine_request, shape

    def _adapter(self, tensors: Mapping[str, np.ndarray]) -> str | None:
        """The adapter ``lora_task_id`` names (cached first from ``lora_weights`` and
        ``lora_config`` when they come with it: docs/api/trt.md#lora), None without one; ValueError
        (LoRAError) naming the tensor or the id."""
        if "lora_task_id" not in tensors:
            return None
        task_id = int(tensors["lora_task_id"][0])
        manager = self.engine.lora
        if manager is None:
            raise LoRAError(
                f"`lora_task_id` {task_id}: this executor's engine has no LoRA adapters (build "
                "it with enable_lora=True)"
            )
        name = f"trt-task-{task_id}"
        if self.engine.engine.driver is not None:
            raise LoRAError(
                f"`lora_task_id` {task_id}: adapters sent as `lora_weights` cannot run with "
                "`tensor_parallel_size` > 1 (the workers read adapters from directories)"
            )
        if "lora_weights" in tensors:
            model = cast("nn.Module", self.engine.engine.runner.model)
            adapter = adapter_from_trt_rows(
                name,
                tensors["lora_weights"],
                tensors["lora_config"],
                model,
                manager.max_lora_rank,
            )
            manager.add_adapter(adapter)  # replaces a cached adapter of that id
        elif not manager.is_cached(name):
            raise LoRAError(
                f"`lora_task_id` {task_id} is not cached (never sent, or evicted): send "
                "`lora_weights` and `lora_config` with it"
            )
        return name

    def _sink(self, request_id: int) -> Callable[[Delivery], None]:
        def sink(item: Delivery) -> None:  # on the event loop: must not raise
            try:
                self._deliver(request_id, item)
            except Exception as e:
                logger.exception("request %d: building its response failed", request_id)
                self._finish_early(request_id, f"building the response failed: {e!r}")

        return sink

    def _deliver(self, request_id: int, item: Delivery) -> None:
        with self._lock:
            state = self._in_flight.get(request_id)
        if state is None:
            return
        if isinstance(item, RequestFailure):
            self._finish_early(request_id, str(item.error) or repr(item.error))
            return
        shape = state.shape
        if not shape.streaming:
            if item.finished and state.rescore is not None:
                task = self._loop.create_task(self._finish_beams(request_id, state, item))
                self._tasks.add(task)  # held until done (the loop keeps only weak references)
                task.add_done_callback(self._tasks.discard)
            elif item.finished:
                self._emit(InferenceResponse(request_id, final_tensors(item, shape), True))
            return
        maps = stream_tensors(item, shape, state.num_sent)
        state.num_sent += len(maps)
        if item.finished and not maps:
            maps = [empty_stream_tensors()]
        for k, tensors in enumerate(maps):
            final = item.finished and k == len(maps) - 1
            self._emit(InferenceResponse(request_id, tensors, final))

    async def _finish_beams(self, request_id: int, state: _InFlight, out: RequestOutput) -> None:
        """The final response of a beam search that asked for generation logits."""
        assert state.rescore is not None
        try:
            tensors = final_tensors(out, state.shape)
            tensors["generation_logits"] = await beam_generation_logits(
                self.engine, state.rescore, out, state.shape.beam_width
            )
        except Exception as e:
            logger.exception("request %d: recomputing beam generation logits failed", request_id)
            self._finish_early(request_id, f"computing `generation_logits` failed: {e}")
            return
        self._emit(InferenceResponse(request_id, tensors, True))

    def _finish_early(self, request_id: int, err_msg: str) -> None:
        self._emit(InferenceResponse(request_id, {}, True, err_msg))

    def _emit(self, response: InferenceResponse) -> None:
        with self._lock:
            if response.is_final:
                self._in_flight.pop(response.request_id, None)
            if self._callback is None:
                self._ready.append(response)
                self._lock.notify_all()
                return
        try:
            self._callback(
                response.request_id, response.tensors, response.is_final, response.err_msg
            )
        except Exception:
            logger.exception("send_response_callback raised for request %d", response.request_id)

    def _take(self, request_id: int | None) -> list[InferenceResponse]:
        if request_id is None:
            taken = list(self._ready)
            self._ready.clear()
            return taken
        taken = [r for r in self._ready if r.request_id == request_id]
        if taken:
            self._ready = deque(r for r in self._ready if r.request_id != request_id)
        return taken

    def _start_own_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="ferrollm-trt", daemon=True).start()
        self._own_loop = loop
        return loop


def _async_engine(model_or_engine: Any, engine_options: dict[str, Any]) -> AsyncEngine:
    if isinstance(model_or_engine, AsyncEngine):
        return model_or_engine
    if isinstance(model_or_engine, LLMEngine):
        return AsyncEngine(model_or_engine)
    engine = getattr(model_or_engine, "engine", None)
    if isinstance(engine, LLMEngine):  # an offline ``LLM``
        return AsyncEngine(engine)
    from ferrollm.config import EngineConfig

    model = None if model_or_engine is None else os.fspath(model_or_engine)
    return AsyncEngine.from_config(EngineConfig(model=model, **engine_options))


def _limits(engine: AsyncEngine) -> Limits:
    """The model's limits: its vocabulary, lengths and widest beam."""
    max_model_len = engine.max_model_len
    return Limits(
        max_model_len=max_model_len,
        max_input_tokens=max_model_len - 1,
        max_position_embeddings=engine.model_config.max_position_embeddings,
        max_iter_times=max_model_len,
        vocab_size=engine.model_config.vocab_size,
        max_beam_width=engine.max_beam_width,
    )


def _draft_tokens(ids: np.ndarray | None) -> np.ndarray | None:
    """``draft_input_ids`` as the engine's draft (speculative decoding: verified in one step)."""
    return None if ids is None else ids.reshape(-1).astype(np.uint32)
