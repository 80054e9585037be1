"""`EngineConfig` checks and defaults, dtype resolution, and KV-cache sizing after profiling."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from cpu_support import fake_cpu
from ferrollm.config import (
    DEFAULT_CPU_KV_CACHE_MEMORY,
    EngineConfig,
    EngineConfigError,
    parse_bytes,
)
from ferrollm.executor.kv_cache import KVCacheSpec
from ferrollm.executor.sizing import (
    CPU_KV_SEQUENCES,
    asks_for_block_weights,
    default_kv_cache_memory,
    plan_kv_cache,
    resolve_dtype,
)
from ferrollm.models.config import ModelConfig
from ferrollm.models.llama import LlamaForCausalLM
from ferrollm.models.registry import build_model
from ferrollm.platforms import MemoryInfo
from ferrollm.platforms import cpu as cpu_platform
from ferrollm.platforms.base import Platform
from ferrollm.platforms.cpu import CpuPlatform
from ferrollm.platforms.npu import NpuPlatform

GiB = 2**30


class FixedMemoryCpu(CpuPlatform):
    """The CPU, reporting a chosen amount of free memory."""

    free: ClassVar[int] = 64 * GiB

    def memory_info(self) -> MemoryInfo:
        return MemoryInfo(free=self.free, total=2 * self.free)


class FakeAccelerator(FixedMemoryCpu):
    """Runs on the CPU but sizes and picks dtypes like an accelerator (whatever the host CPU
    has: "auto" is the accelerator's preferred dtype, never the CPU's bfloat16 probe)."""

    is_accelerator = True
    preferred_dtype = torch.bfloat16

    def auto_dtype(self) -> torch.dtype:
        return Platform.auto_dtype(self)


# --- EngineConfig --------------------------------------------------------------------------


def test_defaults_are_the_documented_ones() -> None:
    c = EngineConfig()
    assert (c.model, c.dtype, c.device, c.block_size) == (None, "auto", None, 16)
    assert (c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len) == (256, None, None)
    assert (c.kv_cache_memory, c.enable_prefix_caching, c.seed) == (None, True, None)
    assert c.max_num_waiting == 4096


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        ({"block_size": 0}, "block_size", "`block_size` must be a positive integer; got 0"),
        ({"max_num_seqs": -1}, "max_num_seqs", "`max_num_seqs` must be a positive integer"),
        ({"max_num_seqs": True}, "max_num_seqs", "got True"),
        ({"max_num_batched_tokens": 1.5}, "max_num_batched_tokens", "positive integer"),
        ({"max_model_len": 0}, "max_model_len", "`max_model_len` must be a positive integer"),
        ({"max_num_waiting": 0}, "max_num_waiting", "positive integer"),
        ({"dtype": "int8"}, "dtype", "`dtype` must be one of auto, float32, bfloat16, float16"),
        ({"device": "tpu"}, "device", "`device` must be one of npu, cuda, cpu; got 'tpu'"),
        ({"kv_cache_memory": "lots"}, "kv_cache_memory", "size like '4GiB'"),
        ({"kv_cache_memory": 0}, "kv_cache_memory", "got 0"),
        ({"enable_prefix_caching": "yes"}, "enable_prefix_caching", "true or false"),
        ({"priority_aging_s": 0}, "priority_aging_s", "positive number"),
        ({"logprobs_mode": "soft"}, "logprobs_mode", "one of raw, processed"),
        ({"seed": -3}, "seed", "non-negative integer"),
        ({"model": 3}, "model", "`model` must be a path"),
    ],
)
def test_each_bad_option_names_its_field(options: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(EngineConfigError, match=message) as info:
        EngineConfig(**options)
    assert info.value.field == field
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1024, 1024),
        ("4GiB", 4 * GiB),
        ("4G", 4 * GiB),
        ("4gb", 4 * 10**9),
        ("512 MiB", 512 * 2**20),
        ("1.5GiB", int(1.5 * GiB)),
        ("100", 100),
        ("64KB", 64_000),
    ],
)
def test_kv_cache_memory_sizes(value: int | str, expected: int) -> None:
    assert parse_bytes(value) == expected
    assert EngineConfig(kv_cache_memory=value).kv_cache_bytes == expected


def test_aliases_are_normalised() -> None:
    assert EngineConfig(dtype="bf16").dtype == "bfloat16"
    assert EngineConfig(dtype="FP32").dtype == "float32"
    assert EngineConfig(model=Path("/m")).model == "/m"


def test_from_dict_and_json_mirror_the_flags(tmp_path: Path) -> None:
    options = {"max-num-seqs": 8, "kv_cache_memory": "1GiB", "dtype": "float32", "seed": 7}
    c = EngineConfig.from_dict(options)
    assert (c.max_num_seqs, c.kv_cache_memory, c.dtype, c.seed) == (8, GiB, "float32", 7)
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(options))
    assert EngineConfig.from_json_file(path) == c
    assert EngineConfig.from_dict(c.to_dict()) == c


def test_from_dict_rejects_unknown_options(tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match="unknown engine option `max_seqs`; valid: ") as e:
        EngineConfig.from_dict({"max_seqs": 3})
    assert e.value.field == "max_seqs"
    path = tmp_path / "list.json"
    path.write_text("[1]")
    with pytest.raises(EngineConfigError, match="must hold a JSON object"):
        EngineConfig.from_json_file(path)


def test_for_platform_fills_device_defaults() -> None:
    assert EngineConfig().for_platform(CpuPlatform()).max_num_batched_tokens == 2048
    assert EngineConfig().for_platform(FakeAccelerator()).max_num_batched_tokens == 8192
    assert EngineConfig().for_platform(CpuPlatform()).max_beam_width == 8
    assert EngineConfig().for_platform(FakeAccelerator()).max_beam_width == 16
    explicit = EngineConfig(max_num_batched_tokens=64, max_beam_width=3)
    assert explicit.for_platform(FakeAccelerator()) == explicit
    with pytest.raises(EngineConfigError, match="`max_beam_width` must be at most 128"):
        EngineConfig(max_beam_width=129)
    with pytest.raises(ValueError, match="`block_size` must be a multiple of 128"):
        EngineConfig().for_platform(NpuPlatform())
    assert EngineConfig(block_size=128).for_platform(NpuPlatform()).block_size == 128


# --- dtype ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("platform", "requested", "expected"),
    [
        (FakeAccelerator(), "auto", torch.bfloat16),
        (NpuPlatform(), "auto", torch.bfloat16),
        (CpuPlatform(), "bf16", torch.bfloat16),
        (CpuPlatform(), "float16", torch.float16),
        (FakeAccelerator(), "float32", torch.float32),
    ],
)
def test_resolve_dtype(platform: Any, requested: str, expected: torch.dtype) -> None:
    assert resolve_dtype(platform, requested) == expected


@pytest.mark.parametrize(
    ("fast_bf16", "expected"), [(True, torch.bfloat16), (False, torch.float32)]
)
def test_auto_dtype_on_cpu_is_bfloat16_only_where_it_is_fast(
    monkeypatch: pytest.MonkeyPatch, fast_bf16: bool, expected: torch.dtype
) -> None:
    monkeypatch.setattr(cpu_platform, "has_fast_bfloat16", lambda: fast_bf16)
    assert resolve_dtype(CpuPlatform(), "auto") == expected


@pytest.mark.parametrize("fast_bf16", [True, False])
def test_auto_dtype_on_cpu_is_float32_for_block_weights(
    monkeypatch: pytest.MonkeyPatch, fast_bf16: bool
) -> None:
    """The block kernels quantize activations to int8 whatever their dtype: bfloat16 would
    only add dense copies. A dtype asked for is kept; accelerators are not concerned."""
    monkeypatch.setattr(cpu_platform, "has_fast_bfloat16", lambda: fast_bf16)
    assert resolve_dtype(CpuPlatform(), "auto", block_weights=True) == torch.float32
    assert resolve_dtype(CpuPlatform(), "bfloat16", block_weights=True) == torch.bfloat16
    assert resolve_dtype(NpuPlatform(), "auto", block_weights=True) == torch.bfloat16


@pytest.mark.parametrize(
    ("quantization", "source_is_quantized", "expected"),
    [
        ("auto", True, True),
        ("auto", False, False),
        ("none", True, False),
        ("int4", False, True),
        ("int8", True, True),
    ],
)
def test_block_weights_are_asked_for_by_int4_int8_or_auto_on_a_quantized_file(
    quantization: str, source_is_quantized: bool, expected: bool
) -> None:
    config = EngineConfig(quantization=quantization)
    assert asks_for_block_weights(config, source_is_quantized) is expected


def test_a_cpu_without_bfloat16_flags_is_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_platform.has_fast_bfloat16.cache_clear()
    fake_cpu(monkeypatch, "avx2", "fma")
    monkeypatch.setattr(cpu_platform, "_time_linear", lambda dtype: pytest.fail("probed"))
    try:
        assert not cpu_platform.has_fast_bfloat16()
    finally:
        cpu_platform.has_fast_bfloat16.cache_clear()


def test_the_bfloat16_probe_wants_a_real_speedup(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_platform.has_fast_bfloat16.cache_clear()
    fake_cpu(monkeypatch, "avx512_bf16")
    timings = {torch.float32: 1.0, torch.bfloat16: 0.9}  # flags, but no faster: float32
    monkeypatch.setattr(cpu_platform, "_time_linear", timings.__getitem__)
    try:
        assert not cpu_platform.has_fast_bfloat16()
        cpu_platform.has_fast_bfloat16.cache_clear()
        timings[torch.bfloat16] = 0.4
        assert cpu_platform.has_fast_bfloat16()
    finally:
        cpu_platform.has_fast_bfloat16.cache_clear()


def test_kv_cache_dtype_errors_name_their_field() -> None:
    with pytest.raises(EngineConfigError, match="`kv_cache_dtype` float32 is not supported") as e:
        resolve_dtype(NpuPlatform(), "float32", "kv_cache_dtype")
    assert e.value.field == "kv_cache_dtype"


def test_resolve_dtype_errors_name_the_field() -> None:
    with pytest.raises(EngineConfigError, match="`dtype` float32 is not supported on npu") as e:
        resolve_dtype(NpuPlatform(), "float32")
    assert e.value.field == "dtype"
    with pytest.raises(EngineConfigError, match="`dtype` must be one of"):
        resolve_dtype(CpuPlatform(), "int4")


# --- KV cache sizing -----------------------------------------------------------------------

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
BLOCK = 4
#: K and V x 2 layers x 4 tokens x 2 heads x 8 dims x 4 bytes.
BPB = 1024


@pytest.fixture(scope="module")
def tiny() -> tuple[LlamaForCausalLM, KVCacheSpec]:
    config = ModelConfig.from_hf_dict(TINY)
    model = build_model(config, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02)
    spec = KVCacheSpec(2, 2, 8, BLOCK, torch.float32)
    return model, spec


def _plan(tiny: Any, platform: Any = None, **options: Any) -> Any:
    model, spec = tiny
    platform = platform or FixedMemoryCpu()
    config = EngineConfig(max_num_batched_tokens=32, **options).for_platform(platform)
    return plan_kv_cache(model, spec, platform, config, model_max_len=256)


def test_blocks_come_from_the_budget_and_are_logged(
    tiny: Any, caplog: pytest.LogCaptureFixture
) -> None:
    assert tiny[1].bytes_per_block == BPB
    with caplog.at_level(logging.INFO, logger="ferrollm.executor.sizing"):
        plan = _plan(tiny, kv_cache_memory=BPB * 100, max_num_seqs=4)
    assert (plan.num_blocks, plan.max_model_len, plan.budget_bytes) == (100, 256, BPB * 100)
    assert "KV cache: 100 blocks of 4 tokens" in caplog.text
    assert f"{BPB // BLOCK} bytes per token" in caplog.text


def test_blocks_are_capped_by_what_the_sequences_can_use(tiny: Any) -> None:
    plan = _plan(tiny, kv_cache_memory="1GiB", max_num_seqs=3, max_model_len=40)
    assert plan.num_blocks == 3 * 10 + 1  # + the null block
    assert plan.max_model_len == 40


def test_unset_max_model_len_is_lowered_to_what_the_cache_holds(
    tiny: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ferrollm.executor.sizing"):
        plan = _plan(tiny, kv_cache_memory=BPB * 11)
    assert (plan.num_blocks, plan.max_model_len) == (11, 40)
    assert "max_model_len lowered from 256 to 40" in caplog.text


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        ({"kv_cache_memory": BPB * 11, "max_model_len": 64}, "max_model_len", "cannot hold"),
        ({"kv_cache_memory": BPB + 100}, "kv_cache_memory", r"raise `kv_cache_memory`"),
        ({"max_model_len": 257}, "max_model_len", r"exceeds the model's context length \(256"),
    ],
)
def test_impossible_sizes_are_clear_errors(
    tiny: Any, options: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(EngineConfigError, match=message) as e:
        _plan(tiny, **options)
    assert e.value.field == field


def test_default_budgets() -> None:
    spec = KVCacheSpec(30, 3, 64, 16, torch.bfloat16)  # SmolLM2-135M: 368,640 bytes a block
    # CPU: two sequences of max_model_len, not a fixed size.
    needed = (CPU_KV_SEQUENCES * 8192 // 16 + 1) * spec.bytes_per_block
    assert default_kv_cache_memory(FixedMemoryCpu(), spec, 8192) == needed
    assert needed < 400 * 2**20
    # Capped by the old fixed budget, and by available memory.
    huge = 10**6
    assert default_kv_cache_memory(FixedMemoryCpu(), spec, huge) == DEFAULT_CPU_KV_CACHE_MEMORY
    small = type("SmallCpu", (FixedMemoryCpu,), {"free": 256 * 2**20})
    assert default_kv_cache_memory(small(), spec, 8192) == int(0.9 * 256 * 2**20)
    assert default_kv_cache_memory(FakeAccelerator(), spec, 8192) == int(0.9 * 64 * GiB)
    # A media model's encoder cache comes out of the free memory first.
    assert default_kv_cache_memory(FakeAccelerator(), spec, 8192, GiB) == int(0.9 * 64 * GiB) - GiB
    assert default_kv_cache_memory(small(), spec, 8192, 2**20) == int(0.9 * 256 * 2**20) - 2**20
    assert default_kv_cache_memory(FixedMemoryCpu(), spec, 8192, 2**20) == needed


def test_default_budget_applies_when_none_given(tiny: Any) -> None:
    small = type("SmallAccelerator", (FakeAccelerator,), {"free": BPB * 50})
    plan = _plan(tiny, small(), max_num_seqs=2)
    assert plan.budget_bytes == int(0.9 * BPB * 50)
    assert plan.num_blocks == int(0.9 * 50)


def test_plan_needs_platform_defaults(tiny: Any) -> None:
    with pytest.raises(ValueError, match="for_platform"):
        plan_kv_cache(tiny[0], tiny[1], CpuPlatform(), EngineConfig(), model_max_len=256)
