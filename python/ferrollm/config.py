"""`EngineConfig`: every engine option, its default and its check, in one place.

The CLI flags, ``LLM(**options)`` and a JSON config file all build an ``EngineConfig``; nothing
else holds a default. Options whose default depends on the device (``max_num_batched_tokens``)
or on the model (``max_model_len``, ``dtype="auto"``) stay None/"auto" here and are resolved by
``for_platform`` and ``ferrollm.executor.sizing``. Torch is not imported: the config can be
built and checked before a device is touched.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ferrollm.devices import DEVICE_NAMES

if TYPE_CHECKING:
    from ferrollm.platforms import Platform

#: The KV-cache budget on CPU when ``kv_cache_memory`` is not given (capped by free memory).
DEFAULT_CPU_KV_CACHE_MEMORY = 2 * 1024**3
#: The share of an accelerator's free memory (after weights and a profiling pass) the KV
#: cache takes when ``kv_cache_memory`` is not given.
DEFAULT_ACCELERATOR_MEMORY_FRACTION = 0.9
#: ``max_num_batched_tokens`` when not given: a CPU step of 2048 tokens already takes seconds,
#: and a smaller step keeps decode latency steady while long prompts prefill in chunks.
DEFAULT_MAX_NUM_BATCHED_TOKENS = {"cpu": 2048, "accelerator": 8192}
#: How completions count ``text_offset`` across choices (ServerConfig.text_offset_mode).
TEXT_OFFSET_MODES = ("openai", "mindie")
#: ``tool_call_parser``: a family (``ferrollm.tools.formats.FORMATS``, kept equal), "auto"
#: (detected from the chat template) or "none" (tool calling off).
TOOL_CALL_PARSERS = ("auto", "none", "hermes", "llama3_json", "mistral", "chatglm3")
#: Widest beam search by default: every beam is a row of each step, so a CPU keeps it narrow.
DEFAULT_MAX_BEAM_WIDTH = {"cpu": 8, "accelerator": 16}
#: The widest beam the API allows at all (SPEC: `n` / `best_of` in [1, 128]).
MAX_BEAM_WIDTH = 128

#: dtype names, and the aliases accepted for them.
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
_DTYPE_ALIASES = {
    "float": "float32",
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
}
LOGPROBS_MODES = ("raw", "processed")
#: ``task``: what a server runs. ``pooling``: how an embedding model pools (see
#: ``ferrollm.models.pooling.POOLING_MODES``, kept equal; this module does not import torch).
TASKS = ("generate", "embed")
POOLING_NAMES = ("mean", "cls", "last", "max")
#: Weight quantization: "auto" keeps what the checkpoint has (where the compute dtype allows),
#: "none" runs dense weights (dequantizing a quantized file), "int8"/"int4" quantize at load.
QUANTIZATION_NAMES = ("auto", "none", "int8", "int4")
#: Compiled decode steps (``ferrollm.executor.compiled_decode``): "auto" (on for CPU steps in
#: a reduced-precision dtype, where it measured faster; off in float32, the parity mode), "on"
#: or "off".
COMPILE_NAMES = ("auto", "on", "off")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(|b|[kmgt]i?b?)\s*$", re.IGNORECASE)
# Binary multiples for KiB/K, decimal for KB, as `free`, docker and vLLM read them.
_UNIT = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_DECIMAL_UNIT = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


class EngineConfigError(ValueError):
    """An engine option broke its rule; ``field`` names the option."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class EngineConfig:
    """Engine options (CLI ``--max-num-seqs`` is ``max_num_seqs``), validated on construction.

    Raises EngineConfigError naming the option. ``kv_cache_memory`` is stored in bytes.
    """

    #: A Hugging Face model directory or a ``.gguf`` file; None = the default model.
    model: str | None = None
    #: "auto" (bfloat16 on accelerators and on CPUs with bfloat16 units, else float32),
    #: "float32", "bfloat16" or "float16".
    dtype: str = "auto"
    #: Weights: "auto" (a quantized GGUF stays quantized), "none", "int8" or "int4".
    #: ``dtype="float32", quantization="none"`` is the exact-parity mode.
    quantization: str = "auto"
    #: KV-cache dtype: "auto" (the compute dtype; bfloat16 on CPU with quantized weights),
    #: "float32", "bfloat16" or "float16".
    kv_cache_dtype: str = "auto"
    #: Decode steps through per-batch-size inductor graphs: "auto" (CPU, not float32), "on"
    #: or "off". Graphs are cached on disk (``$FERROLLM_COMPILE_CACHE``, default
    #: ``~/.cache/ferrollm/inductor``) and built at start-up.
    compile: str = "auto"
    #: "cpu", "cuda" or "npu"; None = detected (npu, then cuda, then cpu).
    device: str | None = None
    #: Tokens per KV-cache block.
    block_size: int = 16
    #: Sequences in one step at most.
    max_num_seqs: int = 256
    #: Tokens in one step at most (chunked prefill splits longer prompts); None = 2048 on CPU,
    #: 8192 on accelerators.
    max_num_batched_tokens: int | None = None
    #: Prompt + output tokens per sequence; None = the model's context length (lowered to what
    #: the KV cache holds, with a warning).
    max_model_len: int | None = None
    #: Waiting requests at most; more are refused with QueueFullError (HTTP 503).
    max_num_waiting: int = 4096
    #: Beam search: the widest beam group a request may ask for (`best_of` / `n` under
    #: `use_beam_search`, TRT `beam_width`); None = 8 on CPU, 16 on accelerators.
    max_beam_width: int | None = None
    #: KV-cache budget: bytes, or a size like "4GiB" / "512MB"; None = 90% of free memory
    #: (after a profiling pass) on accelerators; on CPU what ``max_model_len`` needs (see
    #: ``ferrollm.executor.sizing.default_kv_cache_memory``).
    kv_cache_memory: int | str | None = None
    enable_prefix_caching: bool = True
    #: Seconds after which a waiting request gains one priority level.
    priority_aging_s: float = 10.0
    #: Logprobs of the "raw" logits (vLLM's default) or of the "processed" distribution.
    logprobs_mode: str = "raw"
    #: Base seed for requests without their own seed; None = random.
    seed: int | None = None
    #: What the server runs: "generate" (a decoder model) or "embed" (an encoder model, e.g.
    #: BERT/MiniLM; with no model, the default embedding model).
    task: str = "generate"
    #: Embedding pooling ("mean", "cls", "last", "max") where the model does not declare one
    #: (a sentence-transformers modules.json does); given, it overrides the declared one.
    pooling: str | None = None
    #: Speculative decoding without a client draft: "ngram" (prompt-lookup decoding: each
    #: decode step also verifies the continuation of the latest earlier occurrence of the
    #: sequence's last n-gram) or None (off). Beam search and grammar-constrained requests
    #: never speculate.
    speculative: str | None = None
    #: Draft tokens the n-gram drafter proposes per step, at most.
    num_speculative_tokens: int = 4
    #: Shortest and longest n-gram the drafter matches (the longest match wins).
    ngram_min: int = 1
    ngram_max: int = 3
    #: Tensor parallelism: the processes (devices) one model is split across. Rank 0 (this
    #: process) spawns the others on this node, unless torch's launcher environment
    #: (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``) places the ranks.
    tensor_parallel_size: int = 1
    #: Seconds a tensor-parallel collective (start-up included) may wait for a rank before
    #: the group is declared broken; None = 300. Needs ``tensor_parallel_size`` > 1.
    distributed_timeout: float | None = None

    def __post_init__(self) -> None:
        _check_fields(self)
        if self.model is not None:
            if not isinstance(self.model, (str, os.PathLike)):
                raise EngineConfigError(
                    "model", f"`model` must be a path or None; got {self.model!r}"
                )
            object.__setattr__(self, "model", os.fspath(self.model))
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        object.__setattr__(
            self, "kv_cache_dtype", dtype_name(self.kv_cache_dtype, "kv_cache_dtype")
        )
        if self.kv_cache_memory is not None:
            object.__setattr__(self, "kv_cache_memory", parse_bytes(self.kv_cache_memory))

    @property
    def kv_cache_bytes(self) -> int | None:
        """``kv_cache_memory`` in bytes (None = the device's default budget)."""
        value = self.kv_cache_memory
        return None if value is None else int(value)

    def for_platform(self, platform: Platform) -> EngineConfig:
        """This config with device-dependent defaults filled in, checked against ``platform``."""
        platform.check_block_size(self.block_size)
        kind = "accelerator" if platform.is_accelerator else "cpu"
        return dataclasses.replace(
            self,
            max_num_batched_tokens=self.max_num_batched_tokens
            or DEFAULT_MAX_NUM_BATCHED_TOKENS[kind],
            max_beam_width=self.max_beam_width or DEFAULT_MAX_BEAM_WIDTH[kind],
        )

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> EngineConfig:
        """Build from a mapping of option names (``max_num_seqs`` or ``max-num-seqs``)."""
        names = {f.name for f in fields(cls)}
        kwargs = {}
        for key, value in options.items():
            name = str(key).replace("-", "_")
            if name not in names:
                raise EngineConfigError(
                    name, f"unknown engine option `{key}`; valid: {', '.join(sorted(names))}"
                )
            kwargs[name] = value
        return cls(**kwargs)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str]) -> EngineConfig:
        """Build from a JSON object of options in the file at ``path``."""
        return cls.from_dict(read_options_file(path))

    def to_dict(self) -> dict[str, Any]:
        """The options as a plain dict (``from_dict(c.to_dict()) == c``)."""
        return dataclasses.asdict(self)


def parse_bytes(value: int | str) -> int:
    """Bytes from an int or a size string: "4GiB", "4G" and "4096MiB" are binary, "4GB" decimal.

    Raises EngineConfigError (field ``kv_cache_memory``) unless the result is positive.
    """
    if isinstance(value, bool):
        raise _bad_size(value)
    if isinstance(value, int):
        if value <= 0:
            raise _bad_size(value)
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise _bad_size(value)
    number, unit = float(match[1]), match[2].lower()
    scale = _DECIMAL_UNIT.get(unit) or _UNIT[unit[:1]]
    result = int(number * scale)
    if result <= 0:
        raise _bad_size(value)
    return result


def _bad_size(value: object) -> EngineConfigError:
    return EngineConfigError(
        "kv_cache_memory",
        "`kv_cache_memory` must be a positive number of bytes or a size like '4GiB' or "
        f"'512MB'; got {value!r}",
    )


def dtype_name(value: str, field: str = "dtype") -> str:
    """The canonical name of a dtype option ("bf16" -> "bfloat16"); raises EngineConfigError
    naming ``field``."""
    name = _DTYPE_ALIASES.get(str(value).lower(), str(value).lower())
    if name not in DTYPE_NAMES:
        raise EngineConfigError(
            field, f"`{field}` must be one of {', '.join(DTYPE_NAMES)}; got {value!r}"
        )
    return name


def _check_fields(config: EngineConfig) -> None:
    for name in ("block_size", "max_num_seqs", "max_num_waiting"):
        _positive_int(name, getattr(config, name))
    for name in ("max_num_batched_tokens", "max_model_len", "max_beam_width"):
        if getattr(config, name) is not None:
            _positive_int(name, getattr(config, name))
    if config.max_beam_width is not None and config.max_beam_width > MAX_BEAM_WIDTH:
        raise EngineConfigError(
            "max_beam_width",
            f"`max_beam_width` must be at most {MAX_BEAM_WIDTH}; got {config.max_beam_width}",
        )
    if config.device is not None and config.device not in DEVICE_NAMES:
        raise EngineConfigError(
            "device", f"`device` must be one of {', '.join(DEVICE_NAMES)}; got {config.device!r}"
        )
    if not isinstance(config.enable_prefix_caching, bool):
        raise EngineConfigError(
            "enable_prefix_caching",
            f"`enable_prefix_caching` must be true or false; got {config.enable_prefix_caching!r}",
        )
    aging = config.priority_aging_s
    if isinstance(aging, bool) or not isinstance(aging, (int, float)) or not aging > 0:
        raise EngineConfigError(
            "priority_aging_s", f"`priority_aging_s` must be a positive number; got {aging!r}"
        )
    if config.quantization not in QUANTIZATION_NAMES:
        raise EngineConfigError(
            "quantization",
            f"`quantization` must be one of {', '.join(QUANTIZATION_NAMES)}; "
            f"got {config.quantization!r}",
        )
    if config.compile not in COMPILE_NAMES:
        raise EngineConfigError(
            "compile",
            f"`compile` must be one of {', '.join(COMPILE_NAMES)}; got {config.compile!r}",
        )
    if config.logprobs_mode not in LOGPROBS_MODES:
        raise EngineConfigError(
            "logprobs_mode",
            f"`logprobs_mode` must be one of {', '.join(LOGPROBS_MODES)}; "
            f"got {config.logprobs_mode!r}",
        )
    if config.task not in TASKS:
        raise EngineConfigError(
            "task", f"`task` must be one of {', '.join(TASKS)}; got {config.task!r}"
        )
    if config.task == "embed":
        _check_embed_options(config)
    if config.pooling is not None and (
        config.task != "embed" or config.pooling not in POOLING_NAMES
    ):
        raise EngineConfigError(
            "pooling",
            f"`pooling` must be one of {', '.join(POOLING_NAMES)} and needs `task` embed; "
            f"got {config.pooling!r} with task {config.task!r}",
        )
    _check_speculative(config)
    _check_parallel(config)
    if config.seed is not None and (
        isinstance(config.seed, bool) or not isinstance(config.seed, int) or config.seed < 0
    ):
        raise EngineConfigError(
            "seed", f"`seed` must be a non-negative integer; got {config.seed!r}"
        )


def _check_speculative(config: EngineConfig) -> None:
    if config.speculative not in SPECULATIVE_NAMES:
        raise EngineConfigError(
            "speculative",
            f'`speculative` must be "ngram" or None (off); got {config.speculative!r}',
        )
    for name in ("num_speculative_tokens", "ngram_min", "ngram_max"):
        _positive_int(name, getattr(config, name))
    if config.ngram_max < config.ngram_min:
        raise EngineConfigError(
            "ngram_max",
            f"`ngram_max` must be at least `ngram_min` ({config.ngram_min}); "
            f"got {config.ngram_max}",
        )


def _check_parallel(config: EngineConfig) -> None:
    _positive_int("tensor_parallel_size", config.tensor_parallel_size)
    timeout = config.distributed_timeout
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise EngineConfigError(
                "distributed_timeout",
                f"`distributed_timeout` must be a number of seconds > 0; got {timeout!r}",
            )
        if config.tensor_parallel_size == 1:
            raise EngineConfigError(
                "distributed_timeout",
                "`distributed_timeout` needs `tensor_parallel_size` > 1 (one process has no "
                "collectives to wait for)",
            )
    if config.tensor_parallel_size > 1 and config.compile == "on":
        raise EngineConfigError(
            "compile",
            "`compile` on cannot be used with `tensor_parallel_size` > 1 (a shard's forward "
            "holds collectives, which are not compiled); use auto or off",
        )
    if config.tensor_parallel_size > 1 and config.task == "embed":
        raise EngineConfigError(
            "tensor_parallel_size",
            "`tensor_parallel_size` > 1 cannot be used with `task` embed (the embedding "
            "engine runs on one device)",
        )


#: What `speculative` may be.
SPECULATIVE_NAMES = (None, "ngram")

#: Generation-only options and their defaults: with ``task`` embed, another value would be
#: ignored, so it is refused.
_GENERATION_ONLY = {
    "quantization": "auto",
    "kv_cache_dtype": "auto",
    "compile": "auto",
    "kv_cache_memory": None,
    "max_model_len": None,
    "max_beam_width": None,
    "block_size": 16,
    "logprobs_mode": "raw",
    "seed": None,
    "enable_prefix_caching": True,
    "priority_aging_s": 10.0,
    "speculative": None,
    "num_speculative_tokens": 4,
    "ngram_min": 1,
    "ngram_max": 3,
}


def _check_embed_options(config: EngineConfig) -> None:
    for name, default in _GENERATION_ONLY.items():
        if getattr(config, name) != default:
            raise EngineConfigError(
                name, f"`{name}` applies to generation and cannot be used with `task` embed"
            )


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise EngineConfigError(name, f"`{name}` must be a positive integer; got {value!r}")


#: The default limit on a request body (SPEC 1.14: 413 past it).
DEFAULT_MAX_BODY_BYTES = 16 * 1024**2
#: Paths that need no API key: health, metrics and the OpenAPI document.
DEFAULT_PUBLIC_PATHS = (
    "/health",
    "/v2/health/live",
    "/v2/health/ready",
    "/metrics",
    "/openapi.json",
)


@dataclass(frozen=True)
class ServerConfig:
    """HTTP server options (CLI ``--served-model-name`` is ``served_model_name``), checked on
    construction. Raises EngineConfigError naming the option."""

    host: str = "127.0.0.1"
    port: int = 8000
    #: The name clients put in ``model`` and the MindIE path (MindIE's ``modelName``); None =
    #: the model file's or directory's name.
    served_model_name: str | None = None
    #: Prompt tokens at most (MindIE's ``maxInputTokenLen``); None = ``max_model_len - 1``.
    max_input_tokens: int | None = None
    #: Generated tokens per request at most, and the ``/v1`` default ``max_tokens`` (MindIE's
    #: ``maxIterTimes``); None = ``max_model_len``.
    max_iter_times: int | None = None
    #: MindIE ``fullTextEnabled``: streamed generate and chat text is cumulative.
    full_text: bool = False
    #: Largest request body: bytes or a size like "16MiB"; larger ones get 413 unread.
    max_body_bytes: int | str = DEFAULT_MAX_BODY_BYTES
    #: Whether a request's ``model`` must equal the served name (404 otherwise, →A-27).
    strict_model_name: bool = True
    #: Completions ``text_offset``: "openai" (each choice counts from 0) or "mindie" (choice k
    #: counts on from where choice k-1's text ended, as MindIE's samples do, →A-52; whole
    #: responses only: a stream interleaves its choices).
    text_offset_mode: str = "openai"
    #: API keys a client must send as ``Authorization: Bearer <key>`` (with those of
    #: ``api_key_file`` and ``FERROLLM_API_KEYS``); none at all = no authentication.
    api_keys: tuple[str, ...] = ()
    #: A file of API keys, one a line (blank lines and ``#`` comments skipped).
    api_key_file: str | None = None
    #: Paths served without a key while keys are configured.
    public_paths: tuple[str, ...] = DEFAULT_PUBLIC_PATHS
    #: Requests one API key may have in flight at once; more get 429.
    max_concurrent_per_key: int = 64
    #: Seconds a request may take, queue time included, when it names no ``timeout`` of its
    #: own; None = no server deadline.
    request_timeout: float | None = None
    #: Admission: requests waiting for their first step, and their prompt tokens, at most;
    #: past either, new requests get 503 with ``Retry-After``.
    max_waiting_requests: int = 256
    max_waiting_tokens: int = 262144
    #: TLS: the server's certificate and key (PEM); ``ssl_ca_certs`` turns on client
    #: certificate verification against those CAs (mutual TLS).
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_ca_certs: str | None = None
    #: Seconds in-flight requests get to finish after SIGTERM before the process exits.
    drain_timeout: float = 30.0
    #: How tool calls are written and parsed: a family, "auto" (detected from the chat
    #: template) or "none" (requests with tools are refused unless ``tool_choice`` is "none").
    tool_call_parser: str = "auto"
    #: ``Host`` header values (the name, without the port; case-insensitive) the server
    #: answers to; any other gets 400. Empty (the default) = any host (no DNS-rebinding
    #: protection: put the names the server is reached by here when that matters).
    allowed_hosts: tuple[str, ...] = ()
    #: Seconds a client may take to send its whole request body after its headers; a client
    #: that trickles it slower gets 408 and the connection is closed.
    body_read_timeout: float = 30.0

    def __post_init__(self) -> None:
        check_reliability_options(self)
        if not isinstance(self.host, str) or not self.host:
            raise EngineConfigError("host", f"`host` must be a non-empty string; got {self.host!r}")
        port = self.port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise EngineConfigError(
                "port", f"`port` must be an integer in [0, 65535]; got {port!r}"
            )
        name = self.served_model_name
        if name is not None and (not isinstance(name, str) or not name):
            raise EngineConfigError(
                "served_model_name", f"`served_model_name` must be a non-empty string; got {name!r}"
            )
        for option in ("max_input_tokens", "max_iter_times"):
            if getattr(self, option) is not None:
                _positive_int(option, getattr(self, option))
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise EngineConfigError(
                "tool_call_parser",
                f"`tool_call_parser` must be one of {', '.join(TOOL_CALL_PARSERS)}; "
                f"got {self.tool_call_parser!r}",
            )
        if self.text_offset_mode not in TEXT_OFFSET_MODES:
            raise EngineConfigError(
                "text_offset_mode",
                f"`text_offset_mode` must be one of {', '.join(TEXT_OFFSET_MODES)}; "
                f"got {self.text_offset_mode!r}",
            )
        for option in ("full_text", "strict_model_name"):
            if not isinstance(getattr(self, option), bool):
                raise EngineConfigError(
                    option, f"`{option}` must be true or false; got {getattr(self, option)!r}"
                )
        try:
            size = parse_bytes(self.max_body_bytes)
        except EngineConfigError:
            raise EngineConfigError(
                "max_body_bytes",
                "`max_body_bytes` must be a positive number of bytes or a size like '16MiB'; "
                f"got {self.max_body_bytes!r}",
            ) from None
        object.__setattr__(self, "max_body_bytes", size)

    @property
    def max_body_size(self) -> int:
        """``max_body_bytes`` in bytes."""
        return int(self.max_body_bytes)


def split_options(options: Mapping[str, Any]) -> tuple[EngineConfig, ServerConfig]:
    """The engine and server configs of one mapping of options (a ``--config`` file mirrors
    the CLI flags: ``max-num-seqs`` or ``max_num_seqs``, ``port``, ``full-text`` ...)."""
    engine_names = {f.name for f in fields(EngineConfig)}
    server_names = {f.name for f in fields(ServerConfig)}
    engine: dict[str, Any] = {}
    server: dict[str, Any] = {}
    for key, value in options.items():
        name = str(key).replace("-", "_")
        if name in engine_names:
            engine[name] = value
        elif name in server_names:
            server[name] = value
        else:
            valid = ", ".join(sorted(engine_names | server_names))
            raise EngineConfigError(name, f"unknown option `{key}`; valid: {valid}")
    return EngineConfig(**engine), ServerConfig(**server)


def read_options_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object of options in the file at ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            options = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise EngineConfigError(
            "config", f"cannot read config file {os.fspath(path)!r}: {e}"
        ) from None
    if not isinstance(options, dict):
        raise EngineConfigError("config", f"{os.fspath(path)!r} must hold a JSON object of options")
    return options


def check_reliability_options(config: ServerConfig) -> None:
    """Check (and normalise: lists -> tuples) the keys, deadline, admission, TLS and drain
    options of ``config``; raises EngineConfigError naming the option."""
    for option in ("api_keys", "public_paths", "allowed_hosts"):
        value = getattr(config, option)
        if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
            raise EngineConfigError(
                option, f"`{option}` must be a list of non-empty strings; got {value!r}"
            )
        object.__setattr__(config, option, tuple(value))
    for option in ("max_concurrent_per_key", "max_waiting_requests", "max_waiting_tokens"):
        _positive_int(option, getattr(config, option))
    object.__setattr__(config, "allowed_hosts", tuple(h.lower() for h in config.allowed_hosts))
    for option in ("request_timeout", "drain_timeout", "body_read_timeout"):
        value = getattr(config, option)
        if value is None and option == "request_timeout":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise EngineConfigError(option, f"`{option}` must be a number > 0; got {value!r}")
    if (config.ssl_certfile is None) != (config.ssl_keyfile is None):
        raise EngineConfigError(
            "ssl_certfile", "`ssl_certfile` and `ssl_keyfile` must be given together"
        )
    if config.ssl_ca_certs is not None and config.ssl_certfile is None:
        raise EngineConfigError(
            "ssl_ca_certs", "`ssl_ca_certs` (client verification) needs `ssl_certfile`"
        )
    for option in ("api_key_file", "ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
        path = getattr(config, option)
        if path is not None and not os.path.isfile(path):
            raise EngineConfigError(option, f"`{option}` {path!r} is not a readable file")
