"""`ServerContext`: what every handler shares (engine, limits, names, metrics, response ids)."""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ferrollm._core import Limits
from ferrollm.server.errors import ApiError
from ferrollm.server.guard import Guard
from ferrollm.server.media_intake import MediaIntake
from ferrollm.server.metrics import Metrics
from ferrollm.server.overload import Admission
from ferrollm.server_config import ServerConfig

if TYPE_CHECKING:
    from ferrollm.engine import AsyncEngine
    from ferrollm.engine.embed_async import AsyncEmbedder
    from ferrollm.lora.manager import LoRAManager
    from ferrollm.tokenizer import Tokenizer


@dataclass
class ServerContext:
    """One server's shared state; lives on the event loop (no locking)."""

    #: The generation engine, or the embedding engine of a ``--task embed`` server; both give
    #: the health and metrics surface (``is_running``, ``seconds_since_progress``, ``stats``).
    engine: AsyncEngine | AsyncEmbedder
    config: ServerConfig
    model_name: str
    limits: Limits
    metrics: Metrics
    #: The media intake of a multimodal model (None: the model is text-only, and the
    #: validator refuses media parts).
    media: MediaIntake | None = None
    #: Unix seconds when the server started (``/v1/models`` ``created``).
    created: int = field(default_factory=lambda: int(time.time()))
    _counter: itertools.count[int] = field(default_factory=itertools.count)
    #: Keys, the per-key cap and the drain (`Guard`); the queue bound (`Admission`).
    guard: Guard = field(init=False)
    admission: Admission = field(init=False)

    def __post_init__(self) -> None:
        self.guard = Guard(self.config)
        self.admission = Admission(self.config)
        self.metrics.watch_admission(self._admission_state)

    def _admission_state(self) -> dict[str, int]:
        return {
            "num_waiting": self.admission.num_waiting,
            "num_waiting_tokens": self.admission.num_waiting_tokens,
            "num_in_flight": self.guard.num_in_flight,
        }

    @classmethod
    def build(cls, engine: AsyncEngine | AsyncEmbedder, config: ServerConfig) -> ServerContext:
        """The context for ``engine``; limits come from the model and ``config``."""
        if engine.task == "embed":
            return cls._build_embed(cast("AsyncEmbedder", engine), config)
        engine = cast("AsyncEngine", engine)
        media = media_intake(engine, config)
        model_config = engine.model_config
        max_model_len = engine.max_model_len
        limits = Limits(
            max_model_len=max_model_len,
            max_input_tokens=config.max_input_tokens or max_model_len,
            max_position_embeddings=model_config.max_position_embeddings,
            max_iter_times=config.max_iter_times or max_model_len,
            vocab_size=model_config.vocab_size,
            max_beam_width=engine.max_beam_width,
            multimodal=media is not None,
        )
        name = config.served_model_name or model_name_of(engine)
        return cls(engine, config, name, limits, Metrics(name, engine.stats), media)

    @classmethod
    def _build_embed(cls, embedder: AsyncEmbedder, config: ServerConfig) -> ServerContext:
        max_input = embedder.embedder.max_input_tokens
        limits = Limits(
            max_model_len=max_input + 1,
            max_input_tokens=min(config.max_input_tokens or max_input, max_input),
            max_position_embeddings=None,
            max_iter_times=1,
            vocab_size=embedder.embedder.tokenizer.vocab_size,
            max_beam_width=1,
            embedding_dimensions=embedder.embedder.dimensions,
        )
        name = config.served_model_name or model_name_of(embedder)
        return cls(embedder, config, name, limits, Metrics(name, embedder.stats))

    @property
    def task(self) -> str:
        """ "generate" or "embed": what this server runs (``--task``)."""
        return self.engine.task

    @property
    def generator(self) -> AsyncEngine:
        """The generation engine; 400 on an embedding server."""
        if self.engine.task != "generate":
            raise ApiError(
                400,
                f"this server runs the embed task ({self.model_name!r} is an embedding model); "
                "it serves /v1/embeddings and the Databricks embeddings task, not generation",
                code="unsupported_task",
            )
        return cast("AsyncEngine", self.engine)

    @property
    def embedder(self) -> AsyncEmbedder:
        """The embedding engine; 400 on a generation server."""
        if self.engine.task != "embed":
            raise ApiError(
                400,
                "`input`: this endpoint does not support the embeddings task: "
                f"{self.model_name!r} is served for generation (start the server with "
                "`--task embed` and an embedding model)",
                param="input",
                code="unsupported_task",
            )
        return cast("AsyncEmbedder", self.engine)

    @property
    def tokenizer(self) -> Tokenizer:
        """The served model's tokenizer and chat template."""
        return self.generator.tokenizer

    def next_id(self) -> str:
        """A fresh response id, MindIE's ``endpoint_common_<n>``
        (docs/decisions.md#response-ids)."""
        return f"endpoint_common_{next(self._counter)}"

    @property
    def lora(self) -> LoRAManager | None:
        """The generation engine's LoRA adapters (``--enable-lora``), or None."""
        return None if self.engine.task != "generate" else self.generator.lora

    def select_model(
        self,
        name: str | None,
        param: str = "model",
        what: str = "model",
        code: str = "model_not_found",
    ) -> str | None:
        """The LoRA adapter that model name ``name`` selects, None for the served model; 404
        ``code`` for any other name (docs/decisions.md#the-model-name): always with adapters
        loaded (a misspelt adapter must not run the base), else unless the name is not
        checked (``strict_model_name`` false)."""
        if name == self.model_name:  # the common case first: no engine lookup
            return None
        lora = self.lora
        if lora is not None and name is not None and name in lora:
            return name
        if not self.config.strict_model_name and lora is None:
            return None
        names = [self.model_name, *(lora.names() if lora is not None else ())]
        raise ApiError(
            404,
            f"{what} {name!r} does not exist; this server serves "
            + ", ".join(repr(n) for n in names),
            param=param,
            code=code,
        )


def media_intake(engine: AsyncEngine, config: ServerConfig) -> MediaIntake | None:
    """The intake for a model that takes media (its processor, the configured sources), or
    None for a text-only model; Pillow and PyAV are checked here, at start-up, so a missing
    extra is one clear error rather than every media request failing."""
    processor = engine.multimodal
    if processor is None:
        return None
    from ferrollm.media import require_media_deps

    require_media_deps()
    return MediaIntake(processor, config.media_policy())


def model_name_of(engine: AsyncEngine | AsyncEmbedder) -> str:
    """The default served name: the model file's stem or the model directory's name."""
    if engine.model_path is None:
        return "model"
    path = Path(os.fspath(engine.model_path))
    return path.stem if path.suffix == ".gguf" else path.name
