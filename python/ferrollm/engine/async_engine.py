"""`AsyncEngine`: the asyncio face of the engine, and the seam the HTTP server builds on.

``generate(request)`` returns an async iterator of `RequestOutput`s for one `EngineRequest`; the
server reads the model's facts (tokenizer, config, ``max_model_len``, path) from here and never
reaches inside, so that the engine can later run in its own process behind this seam. The engine
runs on its own thread (`EngineLoop`); each request's outputs reach it through an
``asyncio.Queue`` filled on the event loop, once per engine step. Closing the iterator early
(``aclose()``, ``break``, task cancellation, a dropped client) aborts the request at the
engine's next step, which frees its KV blocks. Everything here runs on the one event loop that
first calls ``generate``; only the inbox of the `EngineLoop` is shared with the engine thread.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from ferrollm._core import GrammarCompiler, SamplingParams
from ferrollm.engine.engine import LLMEngine
from ferrollm.engine.loop import Delivery, EngineLoop, EngineStepper, GenerationLoop
from ferrollm.engine.outputs import RequestFailure, RequestOutput
from ferrollm.engine.request import EngineRequest
from ferrollm.tokenizer import Tokenizer

if TYPE_CHECKING:
    from pathlib import Path

    from ferrollm.config import EngineConfig
    from ferrollm.lora.manager import LoRAManager
    from ferrollm.models.config import ModelConfig
    from ferrollm.multimodal.inputs import MultimodalProcessor


class EngineDeadError(RuntimeError):
    """The engine has been shut down; no request can be served."""


class ClientIdInUse(ValueError):
    """A client's own request id (MindIE's ``id``, the /v1 routes' ``X-Request-Id`` header) is
    already running (docs/api/mindie.md#client-ids: 409). ``param`` names where the id came
    from."""

    code = "conflict"

    def __init__(self, message: str, param: str = "id") -> None:
        super().__init__(message)
        self.param = param


class AsyncEngine:
    """Serves concurrent requests from one event loop over an engine on its own thread."""

    #: What this engine serves (``ServerContext.task``; the embedding engine says "embed").
    task = "generate"

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._loop: GenerationLoop | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, asyncio.Queue[Delivery]] = {}
        #: Requests whose outputs go to a callback instead of a stream (`attach`).
        self._sinks: dict[str, Callable[[Delivery], None]] = {}
        #: Client ids of requests in flight (`generate`'s ``client_id``), to their engine ids.
        self._client_ids: dict[str, str] = {}
        self._closed = False
        #: Called on the event loop if the engine thread dies (after open streams failed).
        self.on_death: Callable[[BaseException], None] | None = None

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        """Load the model and build the engine (see `LLMEngine.from_config`)."""
        return cls(LLMEngine.from_config(config))

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer and chat template."""
        return self.engine.tokenizer

    @property
    def model_config(self) -> ModelConfig:
        """The served model's configuration."""
        return self.engine.model_config

    @property
    def lora(self) -> LoRAManager | None:
        """The engine's LoRA adapters (``enable_lora``), or None."""
        return self.engine.lora

    @property
    def multimodal(self) -> MultimodalProcessor | None:
        """The engine's media processor (``LLMEngine.multimodal``); None for a text model."""
        return self.engine.multimodal

    @property
    def max_model_len(self) -> int:
        """Prompt plus output tokens of one sequence, at most (the scheduler's limit)."""
        return self.engine.scheduler.max_model_len

    @property
    def grammar_compiler(self) -> GrammarCompiler:
        """The engine's structured-output grammar compiler (thread-safe)."""
        return self.engine.grammar_compiler

    @property
    def max_beam_width(self) -> int:
        """The widest beam search a request may ask for."""
        return self.engine.max_beam_width

    @property
    def model_path(self) -> Path | None:
        """The checkpoint's path (a directory or a .gguf file), when loaded from one."""
        return self.engine.model_path

    def request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int | None = None,
    ) -> EngineRequest:
        """An `EngineRequest` for ``prompt``: text (encoded with the tokenizer's special
        tokens) or token ids; a fresh id when none is given."""
        text = prompt if isinstance(prompt, str) else None
        ids = self.engine.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        request_id = request_id if request_id is not None else self.new_request_id()
        return EngineRequest.of(request_id, ids, params, priority=priority, prompt=text)

    @property
    def client_ids(self) -> frozenset[str]:
        """The client ids of the requests in flight (`generate`'s ``client_id``)."""
        return frozenset(self._client_ids)

    @staticmethod
    def new_request_id() -> str:
        """A fresh engine request id (the one place the server mints them)."""
        return uuid.uuid4().hex

    async def generate(
        self, request: EngineRequest, client_id: str | None = None, client_id_field: str = "id"
    ) -> AsyncIterator[RequestOutput]:
        """Outputs of ``request`` as it runs; the last one has ``finished`` set.

        A rejected or failed request raises its error from the iterator (ValueError for a bad
        request); closing the iterator before the end aborts the request. Request ids are
        checked here, once: the engine thread sees only ids that are not in flight, and a
        ``client_id`` (the client's own id for the request) may name one request in flight
        at a time (`ClientIdInUse` naming ``client_id_field`` otherwise). A client that
        disconnected may reuse its id at once: the id is free when the iterator closes, before
        the engine drops the request.
        """
        engine_loop = self._start()
        request_id = request.request_id
        if request_id in self._streams:
            raise ValueError(
                f"`request_id` {request_id!r} is already in use by an unfinished request"
            )
        if client_id is not None and client_id in self._client_ids:
            raise ClientIdInUse(
                f"a request with `{client_id_field}` {client_id!r} is already running",
                client_id_field,
            )
        queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self._streams[request_id] = queue
        if client_id is not None:
            self._client_ids[client_id] = request_id
        finished = False
        try:
            engine_loop.add(request)
            while not finished:
                item = await queue.get()
                if isinstance(item, RequestFailure):
                    finished = True  # the engine already forgot it
                    raise item.error
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if client_id is not None:
                self._client_ids.pop(client_id, None)
            if not finished and not self._closed:
                engine_loop.abort(request_id)

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this engine serves, once one has used it."""
        return self._event_loop

    def attach(self, request: EngineRequest, sink: Callable[[Delivery], None]) -> None:
        """On the event loop: run ``request``, calling ``sink`` there with each of its outputs
        (its last one ``finished``) or its `RequestFailure`; the callback form of `generate`,
        for in-process APIs that are not coroutines (``ferrollm.trt.Executor``). A request id
        in flight, or a dead engine, fails the request through ``sink`` at once."""
        request_id = request.request_id
        try:
            engine_loop = self._start()
            if request_id in self._streams or request_id in self._sinks:
                raise ValueError(
                    f"`request_id` {request_id!r} is already in use by an unfinished request"
                )
        except Exception as e:  # reported to the caller's sink, as every other failure
            sink(RequestFailure(request_id, e))
            return
        self._sinks[request_id] = sink
        engine_loop.add(request)

    def detach(self, request_id: str) -> None:
        """On the event loop: abort an attached request; its sink still gets the last output."""
        if request_id in self._sinks and self._loop is not None:
            self._loop.abort(request_id)

    def queue_position(self, client_id: str) -> int | None:
        """The place in the engine's waiting queue (1: the next to start) of the request in
        flight under ``client_id``, as of the latest step; None when there is no such request
        or it is not waiting (running, or not yet in the engine). Asking keeps the engine
        thread publishing the queue for a few seconds (`EngineLoop.queue_position`)."""
        request_id = self._client_ids.get(client_id)
        if request_id is None or self._loop is None:
            return None
        return self._loop.queue_position(request_id)

    def stats(self) -> dict[str, int]:
        """The engine's counters (``LLMEngine.stats``: the scheduler's, and the encoder
        cache's on a multimodal engine) as of the latest step."""
        if self._loop is None:  # no engine thread yet: the engine is idle and ours to read
            return self.engine.stats()
        return dict(self._loop.stats)

    @property
    def is_running(self) -> bool:
        """Whether requests can be served: not shut down, and the engine thread (once
        started) is alive and its engine not broken (a broken one's streams may get their
        errors before the thread ends)."""
        loop = self._loop
        return not self._closed and (loop is None or (loop.is_running and not loop.has_failed))

    def seconds_since_progress(self) -> float:
        """Seconds since the engine last finished a step, or 0 when it has nothing to do."""
        if self._loop is None or not self.engine.num_unfinished_requests:
            return 0.0
        return time.monotonic() - self._loop.last_step_time

    def fail_in_flight(self, error: Exception) -> int:
        """On the event loop: abort every request in flight and fail it with ``error`` (its
        stream raises it, its sink gets it); the engine keeps serving. How many there were."""
        open_ids = [*self._streams, *self._sinks]
        if self._loop is not None:
            for request_id in open_ids:
                self._loop.abort(request_id)
        self._dispatch([RequestFailure(request_id, error) for request_id in open_ids])
        return len(open_ids)

    def shutdown(self) -> None:
        """Stop the engine thread and drop its requests; open streams raise EngineDeadError."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            self._loop.shutdown()
            if not self._loop.is_running:  # joined: this thread may touch the engine now
                self.engine.abort_all()
        self.engine.shutdown()
        if self._event_loop is not None and not self._event_loop.is_closed():
            # On the event loop: `_streams` belongs to it, and this may be another thread.
            self._event_loop.call_soon_threadsafe(self._fail_open_streams)

    def _start(self) -> GenerationLoop:
        if self._closed:
            raise EngineDeadError("the engine was shut down")
        event_loop = asyncio.get_running_loop()
        if self._loop is None:
            self._event_loop = event_loop
            stepper = EngineStepper(self.engine)
            self._loop = EngineLoop(stepper, event_loop, self._dispatch, self._died)
            self._loop.start()
        elif event_loop is not self._event_loop:
            raise RuntimeError("an AsyncEngine serves the one event loop that first used it")
        return self._loop

    def _died(self, cause: BaseException) -> None:
        """On the event loop: the engine thread died; nothing more can be served."""
        self._closed = True
        self._fail_open_streams(EngineDeadError(f"the engine stopped: {cause!r}"))
        if self.on_death is not None:
            self.on_death(cause)

    def _fail_open_streams(self, error: EngineDeadError | None = None) -> None:
        error = error or EngineDeadError("the engine was shut down")
        open_ids = [*self._streams, *self._sinks]
        self._dispatch([RequestFailure(request_id, error) for request_id in open_ids])

    def _dispatch(self, deliveries: list[Delivery]) -> None:
        """On the event loop: route one step's outputs to their streams."""
        for item in deliveries:
            queue = self._streams.get(item.request_id)
            if queue is not None:  # None: the consumer already went away
                queue.put_nowait(item)
                continue
            sink = self._sinks.get(item.request_id)
            if sink is not None:
                if isinstance(item, RequestFailure) or item.finished:
                    del self._sinks[item.request_id]
                sink(item)
