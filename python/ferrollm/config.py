"""`EngineConfig`: every engine option, its default and its check, in one place.

The CLI flags, ``LLM(**options)`` and a JSON config file all build an ``EngineConfig``; nothing
else holds a default. Options whose default depends on the device (``max_num_batched_tokens``)
or on the model (``max_model_len``, ``dtype="auto"``) stay None/"auto" here and are resolved by
``for_platform`` and ``ferrollm.executor.sizing``. Torch is not imported: the config can be
built and checked before a device is touched.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ferrollm.devices import DEVICE_NAMES
from ferrollm.lora.options import DEFAULT_MAX_LORA_RANK, LoRAModule, check_lora_options

# Re-exported: every module reads its options' rules from here.
from ferrollm.options import (
    EngineConfigError,
    one_of,
    parse_bytes,
    positive_int,
    read_options_file,
)

if TYPE_CHECKING:
    from ferrollm.platforms import Platform

#: The KV-cache budget on CPU when ``kv_cache_memory`` is not given (capped by free memory).
DEFAULT_CPU_KV_CACHE_MEMORY = 2 * 1024**3
#: The share of an accelerator's free memory (after weights and a profiling pass) the KV
#: cache takes when ``kv_cache_memory`` is not given.
DEFAULT_ACCELERATOR_MEMORY_FRACTION = 0.9
#: A media model's encoder-cache budget when ``encoder_cache_memory`` is not given: 256 MiB of
#: features (SmolVLM-256M: 64 x 576 bfloat16 a tile, about 3,600 tiles).
DEFAULT_ENCODER_CACHE_MEMORY = 256 << 20
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
#: The widest beam the API allows at all (`n` and `best_of` are at most 128:
#: docs/api/openai.md#n-best-of-and-beam-search).
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
#: Compiled decode steps (``ferrollm.executor.compiled_decode`` on the CPU, CUDA graphs on
#: CUDA: ``ferrollm.platforms.cuda_graphs``): "auto" (on the CPU in a reduced-precision dtype,
#: where it measured faster, off in float32, the parity mode; on CUDA in every dtype), "on" or
#: "off".
COMPILE_NAMES = ("auto", "on", "off")
#: Where weights come from: "auto" reads the checkpoint's; "dummy" fills every parameter with
#: small seeded random values on the device instead (``ferrollm.executor.dummy_weights``), so a
#: directory holding only config.json and a tokenizer runs: speed measurements on a model's
#: shape without its weights (vLLM's ``--load-format dummy``).
LOAD_FORMATS = ("auto", "dummy")


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
    #: "auto" (read the checkpoint's weights) or "dummy" (random weights, none read: the
    #: directory needs only config.json and a tokenizer; for benchmarks). "dummy" needs a
    #: Hugging Face directory and dense weights (`quantization` auto or none).
    load_format: str = "auto"
    #: "cpu", "cuda" or "npu"; None = detected (npu, then cuda, then cpu).
    device: str | None = None
    #: Tokens per KV-cache block.
    block_size: int = 16
    #: Sequences in one step at most.
    max_num_seqs: int = 256
    #: Tokens in one step at most (chunked prefill splits longer prompts); None = 2048 on CPU,
    #: 8192 on accelerators.
    max_num_batched_tokens: int | None = None
    #: Media positions (image/video/audio tokens) whose encoding one step may start; a prefill
    #: chunk that would start a media item past it ends before the item (a step's first item
    #: always runs). None = max(``max_num_batched_tokens``, 4096).
    max_num_encoder_tokens: int | None = None
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
    #: A media model's encoder cache (``ferrollm.multimodal.encoder_cache``): bytes of encoder
    #: outputs kept by content, on the model's device, or a size like "256MiB"; 0 keeps none;
    #: None = 256 MiB. Taken from the default KV budget. Only for a model that takes media.
    encoder_cache_memory: int | str | None = None
    #: Reuse the KV blocks of a prompt prefix already computed (shared system prompts, chat
    #: turns) instead of computing them again.
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
    #: LoRA adapters (``ferrollm.lora.options``: vLLM's ``--enable-lora``, ``--lora-modules``,
    #: ``--max-loras``, ``--max-cpu-loras``, ``--max-lora-rank``).
    enable_lora: bool = False
    lora_modules: tuple[LoRAModule, ...] = ()
    max_loras: int = 1
    max_cpu_loras: int | None = None
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK

    def __post_init__(self) -> None:
        _check_fields(self)
        object.__setattr__(self, "lora_modules", check_lora_options(self))
        if self.model is not None:
            if not isinstance(self.model, (str, os.PathLike)):
                raise EngineConfigError(
                    "model", f"`model` must be a path or None; got {self.model!r}"
                )
            object.__setattr__(self, "model", os.fspath(self.model))
        _check_load_format(self)
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        object.__setattr__(
            self, "kv_cache_dtype", dtype_name(self.kv_cache_dtype, "kv_cache_dtype")
        )
        if self.kv_cache_memory is not None:
            object.__setattr__(self, "kv_cache_memory", parse_bytes(self.kv_cache_memory))
        if self.encoder_cache_memory is not None:
            size = parse_bytes(self.encoder_cache_memory, "encoder_cache_memory", zero=True)
            object.__setattr__(self, "encoder_cache_memory", size)

    @property
    def kv_cache_bytes(self) -> int | None:
        """``kv_cache_memory`` in bytes (None = the device's default budget)."""
        value = self.kv_cache_memory
        return None if value is None else int(value)

    @property
    def encoder_cache_bytes(self) -> int:
        """``encoder_cache_memory`` in bytes (its default when not given)."""
        value = self.encoder_cache_memory
        return DEFAULT_ENCODER_CACHE_MEMORY if value is None else int(value)

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
        positive_int(name, getattr(config, name))
    for name in (
        "max_num_batched_tokens",
        "max_num_encoder_tokens",
        "max_model_len",
        "max_beam_width",
    ):
        if getattr(config, name) is not None:
            positive_int(name, getattr(config, name))
    if config.max_beam_width is not None and config.max_beam_width > MAX_BEAM_WIDTH:
        raise EngineConfigError(
            "max_beam_width",
            f"`max_beam_width` must be at most {MAX_BEAM_WIDTH}; got {config.max_beam_width}",
        )
    if config.device is not None:
        one_of("device", config.device, DEVICE_NAMES)
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
    one_of("quantization", config.quantization, QUANTIZATION_NAMES)
    one_of("compile", config.compile, COMPILE_NAMES)
    one_of("load_format", config.load_format, LOAD_FORMATS)
    one_of("logprobs_mode", config.logprobs_mode, LOGPROBS_MODES)
    one_of("task", config.task, TASKS)
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


def _check_load_format(config: EngineConfig) -> None:
    """What dummy weights need that the options alone show (a directory holding one .gguf
    file is refused when it is opened: ``ferrollm.executor.loader``). ``model`` is a str here."""
    if config.load_format != "dummy":
        return
    model = config.model
    if model is None or model.endswith(".gguf"):
        what = "the default model (a GGUF file)" if model is None else repr(model)
        raise EngineConfigError(
            "load_format",
            f"`load_format` dummy needs a Hugging Face model directory (config.json and a "
            f"tokenizer); got {what}",
        )
    if config.quantization not in ("auto", "none"):
        raise EngineConfigError(
            "load_format",
            f"`load_format` dummy fills dense weights; it cannot be used with `quantization` "
            f"{config.quantization} (use auto or none)",
        )


def _check_speculative(config: EngineConfig) -> None:
    if config.speculative not in SPECULATIVE_NAMES:
        raise EngineConfigError(
            "speculative",
            f'`speculative` must be "ngram" or None (off); got {config.speculative!r}',
        )
    for name in ("num_speculative_tokens", "ngram_min", "ngram_max"):
        positive_int(name, getattr(config, name))
    if config.ngram_max < config.ngram_min:
        raise EngineConfigError(
            "ngram_max",
            f"`ngram_max` must be at least `ngram_min` ({config.ngram_min}); "
            f"got {config.ngram_max}",
        )


def _check_parallel(config: EngineConfig) -> None:
    positive_int("tensor_parallel_size", config.tensor_parallel_size)
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
    "load_format": "auto",
    "kv_cache_memory": None,
    "encoder_cache_memory": None,
    "max_model_len": None,
    "max_beam_width": None,
    "max_num_encoder_tokens": None,
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


__all__ = [
    "EngineConfig",
    "EngineConfigError",
    "one_of",
    "parse_bytes",
    "positive_int",
    "read_options_file",
]
