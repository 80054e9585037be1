"""Building what an engine runs: the model with its weights streamed in, its KV cache sized
from free memory, the runner over both (and its compiled decode graphs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ferrollm.config import EngineConfigError
from ferrollm.distributed.driver import Driver
from ferrollm.distributed.startup import GroupMember
from ferrollm.distributed.state import SINGLE, ParallelState
from ferrollm.executor.compiled_decode import build_compiled_decode
from ferrollm.executor.dummy_weights import fill_dummy_weights
from ferrollm.executor.kv_cache import KVCache
from ferrollm.executor.loader import ModelSource
from ferrollm.executor.runner import DecodeGraphs, ModelRunner
from ferrollm.executor.sizing import (
    KVCachePlan,
    asks_for_block_weights,
    plan_kv_cache,
    resolve_dtype,
    resolve_kv_dtype,
    resolve_quantization,
)
from ferrollm.lora.manager import attach_engine_lora
from ferrollm.models.llama import LlamaForCausalLM
from ferrollm.models.registry import build_model
from ferrollm.platforms import Platform
from ferrollm.progress import step

if TYPE_CHECKING:
    from ferrollm.config import EngineConfig
    from ferrollm.lora.layers import LoRAState


def load_model(
    source: ModelSource,
    device: torch.device,
    dtype: torch.dtype,
    quantization: str | None = None,
    parallel: ParallelState = SINGLE,
) -> LlamaForCausalLM:
    """Build the model for ``source`` on ``device`` and stream its weights in, one at a time.

    ``quantization`` is the linear layers' scheme (None = dense); a quantized file's tensors
    then arrive quantized and are packed without a float copy of the model. ``parallel``
    builds this rank's shard and reads only its slices of the checkpoint (ValueError naming
    ``tensor_parallel_size`` when the model or its format cannot split that way). A source
    opened with ``load_format`` dummy has no weights: the model is filled with random ones.
    """
    model = build_model(source.config, device, dtype, quantization, parallel)
    if source.dummy_weights:
        fill_dummy_weights(model)
        return model
    weights = source.iter_weights(
        dtype, keep_quantized=quantization is not None, shard=model.shard_plan()
    )
    model.load_weights(weights)
    return model


@dataclass(frozen=True)
class BuiltRunner:
    """A loaded model over its sized KV cache."""

    runner: ModelRunner
    kv_plan: KVCachePlan
    #: The linear layers' weight scheme (None = dense).
    quantization: str | None
    #: The compiled decode graphs (CPU) or captured CUDA graphs, or None (eager).
    compiled: DecodeGraphs | None
    #: The model's LoRA adapter slots (``enable_lora``), or None.
    lora: LoRAState | None = None


def build_runner(
    config: EngineConfig,
    platform: Platform,
    source: ModelSource,
    group: GroupMember | Driver | None = None,
    *,
    reserved_bytes: int = 0,
) -> BuiltRunner:
    """Load ``source`` (this rank's shard of it, in a group) and size its KV cache, leaving
    ``reserved_bytes`` of the default budget to what else the engine keeps on the device (a
    media model's encoder cache).

    ``config`` must have come through ``for_platform``. In a tensor-parallel group every rank
    calls this with its `GroupMember` (rank 0 with its `Driver`): the ranks agree on one KV
    block count, and a rank that fails to load tells the others before raising.
    """
    parallel = SINGLE if group is None else group.parallel
    try:
        blocks = asks_for_block_weights(config, source.is_quantized)
        dtype = resolve_dtype(platform, config.dtype, block_weights=blocks)
        quantization = resolve_quantization(
            platform, config.quantization, dtype, source.is_quantized
        )
        kv_dtype = resolve_kv_dtype(platform, config.kv_cache_dtype, dtype, quantization)
        model = load_model(source, platform.device, dtype, quantization, parallel=parallel)
        spec = model.kv_cache_spec(config.block_size, kv_dtype)
        with step("Profiling a step to size the KV cache"):
            kv_plan = plan_kv_cache(
                model,
                spec,
                platform,
                config,
                source.config.max_position_embeddings,
                reserved_bytes=reserved_bytes,
            )
    except Exception as e:
        if group is not None:
            group.fail_startup(e)
        raise
    if group is not None:
        kv_plan = group.agree(kv_plan)
    model.set_max_model_len(kv_plan.max_model_len)
    with step(f"Allocating the KV cache ({kv_plan.num_blocks} blocks)"):
        kv_cache = KVCache(spec, kv_plan.num_blocks, platform.device)
    make_runner = ModelRunner if group is None else group.make_runner
    runner = make_runner(model, kv_cache, platform.device, dtype, platform.attention_backend())
    # Slots before graphs: the graphs are built over the adapted layers.
    lora = attach_engine_lora(model, config) if config.enable_lora else None
    with step("Preparing decode steps (compiled graphs where they apply)"):
        compiled = _decode_graphs(config, platform, model, kv_cache, runner, dtype, kv_plan, lora)
    runner.set_compiled(compiled)
    return BuiltRunner(runner, kv_plan, quantization, compiled, lora)


def _decode_graphs(
    config: EngineConfig,
    platform: Platform,
    model: LlamaForCausalLM,
    kv_cache: KVCache,
    runner: ModelRunner,
    dtype: torch.dtype,
    kv_plan: KVCachePlan,
    lora: LoRAState | None,
) -> DecodeGraphs | None:
    """The device's decode graphs or the CPU's compiled ones, as ``config.compile`` asks, or
    None (eager). Every rank of a tensor-parallel group decides alike (a shard stays eager;
    "on" is refused there).

    With adapters, the CPU's compiled graphs take every mix of them (``ferrollm.lora.graph_op``)
    and are built for steps that read adapters and for steps that read none. Captured CUDA
    graphs would freeze one of the two: with adapters the device runs eagerly ("on" refused).
    """
    mode = config.compile
    if lora is not None and platform.device.type != "cpu":
        if mode == "on":
            raise EngineConfigError(
                "compile", "`compile` on: the device's decode graphs do not run LoRA adapters yet"
            )
        return None
    args = (model, kv_cache, runner.backend)
    graphs = platform.decode_graphs(mode, *args, kv_plan.max_model_len, config.max_num_seqs)
    if graphs is not None:
        return graphs
    compiled = build_compiled_decode(mode, *args, dtype, kv_plan.max_model_len, config.max_num_seqs)
    if compiled is not None and lora is not None:
        # The build warmed up the graphs of steps that read adapters (the slots start active).
        with lora.reading_adapters(False):
            compiled.warm_up()
    return compiled
