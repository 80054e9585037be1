"""Deciding what the device can hold: the model dtype, the context length and the KV blocks.

``resolve_dtype`` turns ``EngineConfig.dtype`` (and ``kv_cache_dtype``) into a torch dtype for a
platform; ``resolve_quantization`` decides whether the weights run on quantized kernels.
``plan_kv_cache`` runs one worst-case step (``profile_run``) so activation memory is accounted
for, takes the KV budget (``kv_cache_memory``, or the platform's default), and returns how many
blocks to allocate and the ``max_model_len`` they can serve; the block count is logged.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from ferrollm.config import (
    DEFAULT_ACCELERATOR_MEMORY_FRACTION,
    DEFAULT_CPU_KV_CACHE_MEMORY,
    EngineConfig,
    EngineConfigError,
    dtype_name,
)
from ferrollm.executor.kv_cache import KVCacheSpec
from ferrollm.executor.runner import CausalLM, profile_run
from ferrollm.platforms import Platform

logger = logging.getLogger(__name__)

#: Full-length sequences the default CPU KV cache holds.
CPU_KV_SEQUENCES = 2
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(
    platform: Platform, requested: str, field: str = "dtype", *, block_weights: bool = False
) -> torch.dtype:
    """The model dtype for ``requested`` (an ``EngineConfig.dtype``) on ``platform``.

    "auto" is the platform's ``auto_dtype()``: bfloat16 on accelerators and on CPUs with
    bfloat16 units, float32 on other CPUs; but float32 on a CPU whose linear layers will run
    on the block kernels (``block_weights``: `asks_for_block_weights`). Raises
    EngineConfigError (naming ``field``) for an unknown name or a dtype the device's kernels
    do not run.
    """
    # Why float32 on CPU, measured on the default model (SmolLM2-135M, greedy decode through
    # ModelRunner + Scheduler, best of 3 interleaved runs of 32 tokens; a shared 2-core AMD EPYC
    # VM with AVX2 but no AVX512-BF16/AMX, torch 2.15):
    #     batch         1      8     32
    #     float32    16.4   71.2  189.3  tok/s
    #     bfloat16   31.4   56.3   60.7  tok/s
    # bfloat16 wins only the memory-bound batch of 1 and loses 1.3x / 3.1x at 8 / 32, and it
    # does not keep greedy parity: its tokens equal float32's (= transformers') in only 0/1,
    # 6/8 and 23/32 sequences. On a CPU with AVX512-BF16, bfloat16 `linear` is 2-4x faster
    # than float32 at every batch (benches/linear.py), hence `auto_dtype`'s probe.
    # Why float32 for block weights on every CPU: the kernels quantize the activations to int8
    # whatever their dtype, so bfloat16 pays only through dense bfloat16 copies of the weights
    # for steps of more than QUANTIZED_MAX_ROWS rows (270 MB on the default model, and the
    # compiled decode then stops at that many rows). Default model on a 2-core AMD EPYC with
    # AVX512-BF16 (benches/throughput.py --compile on --max-tokens 64 --repeats 2, tok/s, three
    # runs in one sitting, each run's best): batch 8 bfloat16 252 / 253 against float32 491 /
    # 513, batch 32 539 / 593 against 571 / 518, batch 1 within the machine's noise.
    name = dtype_name(requested, field)
    if name == "auto" and block_weights and platform.name == "cpu":
        dtype = torch.float32
        _say_block_activations()
    else:
        dtype = platform.auto_dtype() if name == "auto" else _TORCH_DTYPES[name]
    if dtype not in platform.supported_dtypes:
        supported = ", ".join(str(d).removeprefix("torch.") for d in platform.supported_dtypes)
        raise EngineConfigError(
            field, f"`{field}` {name} is not supported on {platform.name}; use one of {supported}"
        )
    platform.check_dtype(dtype, field)
    return dtype


def asks_for_block_weights(config: EngineConfig, source_is_quantized: bool) -> bool:
    """Whether ``config`` runs the linear layers on the block kernels where it can: ``int4`` /
    ``int8``, or ``auto`` on a quantized checkpoint."""
    return config.quantization in ("int4", "int8") or (
        config.quantization == "auto" and source_is_quantized
    )


@functools.cache
def _say_block_activations() -> None:
    logger.info(
        "dtype auto: float32 activations, as the quantized weights run on the block kernels, "
        "which quantize activations to int8 (`--dtype bfloat16` keeps dense bfloat16 copies "
        "for batched steps instead, where the CPU has bfloat16 units)"
    )


def resolve_quantization(
    platform: Platform, requested: str, dtype: torch.dtype, source_is_quantized: bool
) -> str | None:
    """The linear layers' scheme (``ferrollm.layers.linear.QUANT_MODES``) for the request.

    The block kernels (``ferrollm.layers.ggml_linear``) run on any CPU with float32 or bfloat16
    activations, so: "auto" keeps a quantized file quantized ("native") there and dequantizes
    it elsewhere (said in the log); "int4"/"int8" need exactly that and raise
    EngineConfigError otherwise.
    """
    if requested == "none":
        return None
    usable = platform.name == "cpu" and dtype in (torch.float32, torch.bfloat16)
    if requested == "auto":
        if source_is_quantized and not usable:
            logger.info(
                "quantized checkpoint dequantized: the block kernels run on CPU with float32 "
                "or bfloat16 activations (here %s on %s)",
                str(dtype).removeprefix("torch."),
                platform.name,
            )
        return "native" if source_is_quantized and usable else None
    if not usable:
        raise EngineConfigError(
            "quantization",
            f"`quantization` {requested} runs on CPU with dtype float32 or bfloat16 (the block "
            f"kernels); got dtype {str(dtype).removeprefix('torch.')} on {platform.name}",
        )
    return requested


def resolve_kv_dtype(
    platform: Platform, requested: str, dtype: torch.dtype, quantization: str | None
) -> torch.dtype:
    """The KV cache's dtype for ``requested`` (``EngineConfig.kv_cache_dtype``).

    "auto" is the compute dtype, except on CPU with quantized weights: bfloat16 there (as
    llama.cpp keeps float16 K/V), half the memory and half the bytes attention reads per token
    of a float32 cache, at a rounding below what the int8 activations already cost (measured
    in tests/engine/test_quantization.py). The parity mode (float32, no quantization) keeps
    float32.
    """
    if requested != "auto":
        return resolve_dtype(platform, requested, "kv_cache_dtype")
    if platform.name == "cpu" and quantization is not None:
        return torch.bfloat16
    return dtype


@dataclass(frozen=True)
class KVCachePlan:
    """How large the KV cache is, and the context length it serves."""

    num_blocks: int
    max_model_len: int
    #: The budget the blocks were carved from.
    budget_bytes: int


def plan_kv_cache(
    model: CausalLM,
    spec: KVCacheSpec,
    platform: Platform,
    config: EngineConfig,
    model_max_len: int,
    *,
    reserved_bytes: int = 0,
) -> KVCachePlan:
    """Profile one worst-case step, then size the KV cache from the memory budget.

    ``config`` must have come through ``EngineConfig.for_platform``; ``model_max_len`` is the
    model's ``max_position_embeddings``. Without ``kv_cache_memory``, the default budget
    leaves ``reserved_bytes`` of the free memory to other caches (a media model's encoder
    cache); an explicit budget is taken as given. Raises EngineConfigError (naming
    ``max_model_len`` or ``kv_cache_memory``) when the request cannot be met.
    """
    if config.max_num_batched_tokens is None:
        raise ValueError("plan_kv_cache needs EngineConfig.for_platform(platform) first")
    max_model_len = _requested_max_model_len(config.max_model_len, model_max_len)
    num_tokens = config.max_num_batched_tokens
    # A decode row with n-gram drafts samples each of its 1 + num_speculative_tokens positions.
    samples_per_seq = 1 + (config.num_speculative_tokens if config.speculative else 0)
    profile_run(
        model,
        spec,
        platform.device,
        num_tokens=num_tokens,
        num_samples=min(config.max_num_seqs * samples_per_seq, num_tokens),
        backend=platform.attention_backend(),
    )
    platform.synchronize()
    budget = config.kv_cache_bytes or default_kv_cache_memory(
        platform, spec, max_model_len, reserved_bytes
    )
    # Never more than every sequence at full length can use (block 0 is the null block).
    usable = config.max_num_seqs * _cdiv(max_model_len, spec.block_size) + 1
    num_blocks = min(spec.num_blocks_for(budget), usable)
    max_model_len = _fit_max_model_len(config, max_model_len, num_blocks, spec.block_size, budget)
    logger.info(
        "KV cache: %d blocks of %d tokens (%d tokens, %d bytes per token, %.2f GiB of a "
        "%.2f GiB budget, %s); max_model_len %d",
        num_blocks,
        spec.block_size,
        (num_blocks - 1) * spec.block_size,
        spec.bytes_per_token,
        num_blocks * spec.bytes_per_block / 2**30,
        budget / 2**30,
        str(spec.dtype).removeprefix("torch."),
        max_model_len,
    )
    return KVCachePlan(num_blocks=num_blocks, max_model_len=max_model_len, budget_bytes=budget)


def default_kv_cache_memory(
    platform: Platform, spec: KVCacheSpec, max_model_len: int, reserved_bytes: int = 0
) -> int:
    """The KV budget when none is given, read after the model and a profiling pass are in memory.

    Accelerators: 90% of free device memory, less ``reserved_bytes``. CPU: what the model
    needs rather than a fixed size: ``CPU_KV_SEQUENCES`` sequences of ``max_model_len``
    tokens (a full-length one with room for many short ones beside it), at most 2 GiB and
    90% of available host memory less ``reserved_bytes``.
    """
    free = platform.memory_info().free
    fraction = max(int(free * DEFAULT_ACCELERATOR_MEMORY_FRACTION) - reserved_bytes, 0)
    if platform.is_accelerator:
        return fraction
    blocks = CPU_KV_SEQUENCES * _cdiv(max_model_len, spec.block_size) + 1
    return min(blocks * spec.bytes_per_block, DEFAULT_CPU_KV_CACHE_MEMORY, fraction)


def _requested_max_model_len(requested: int | None, model_max_len: int) -> int:
    if requested is None:
        return model_max_len
    if requested > model_max_len:
        raise EngineConfigError(
            "max_model_len",
            f"`max_model_len` ({requested}) exceeds the model's context length "
            f"({model_max_len} tokens)",
        )
    return requested


def _fit_max_model_len(
    config: EngineConfig, max_model_len: int, num_blocks: int, block_size: int, budget: int
) -> int:
    """``max_model_len``, lowered to what the blocks hold when the user did not set it."""
    capacity = max(num_blocks - 1, 0) * block_size
    if capacity >= max_model_len:
        return max_model_len
    fix = "raise `kv_cache_memory` or lower `max_model_len`"
    if config.max_model_len is not None or capacity < block_size:
        field = "max_model_len" if config.max_model_len is not None else "kv_cache_memory"
        raise EngineConfigError(
            field,
            f"the KV cache ({budget} bytes: {num_blocks} blocks, {capacity} tokens) cannot "
            f"hold one sequence of max_model_len {max_model_len} tokens; {fix}",
        )
    logger.warning(
        "max_model_len lowered from %d to %d: the KV cache holds no more; %s",
        max_model_len,
        capacity,
        fix,
    )
    return capacity


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
