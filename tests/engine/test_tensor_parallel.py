"""Tensor parallelism on CPU (gloo): a sharded model gives what the whole model gives.

Each group run starts its ranks once and runs every case of a table in it (`tp_support`): a
prefill of two prompts in one step, then greedy decode steps over each rank's paged KV cache.
Rank 0's hidden states and logits must equal the single-process run's: within 1e-5 in float32,
within bfloat16/quantization rounding for quantized weights, with the same greedy tokens. Each
rank must also have read about 1/N of the checkpoint, not all of it. Shapes that cannot split
are refused with a ValueError naming ``tensor_parallel_size``, before any collective runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tp_support import run_group, run_single

from ferrollm.distributed.shard_plan import ShardPlan, TensorSlice
from ferrollm.distributed.state import ParallelState
from ferrollm.executor.loader import load_model_source
from ferrollm.models.llama import LlamaForCausalLM
from ferrollm.models.moe import expert_slice
from ferrollm.models.registry import resolve_model_class
from tiny_gguf import GGUF_FAMILIES, write_tiny_gguf
from tiny_models import build_tiny_model

#: Heads that split three ways (and two ways with the query heads cutting a 32-column block).
SIX_HEADS = {"hidden_size": 96, "num_attention_heads": 6, "intermediate_size": 192}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """``models(family, gguf=None, **sizes) -> path`` of a tiny model (cached)."""
    cache: dict[str, str] = {}

    def make(family: str, gguf: str | None = None, **sizes: Any) -> str:
        key = f"{family}-{gguf}-{sorted(sizes.items())}"
        if key not in cache:
            directory = tmp_path_factory.mktemp(f"tp-{family}")
            build_tiny_model(family, directory, sizes=sizes)
            path = directory
            if gguf is not None:
                file = directory / f"tiny-{gguf}.gguf"
                quant = None if gguf == "F32" else gguf
                path = write_tiny_gguf(directory, file, GGUF_FAMILIES[family], quant)
            cache[key] = str(path)
        return cache[key]

    return make


def _case(name: str, path: str, quantization: str | None = None) -> dict[str, Any]:
    # float32 for the quantized cases too (the block kernels run on it): in bfloat16 the
    # partial products each rank rounds before the reduce moved near-tied logits by an ulp.
    return {"name": name, "path": path, "quantization": quantization, "dtype": "float32"}


def _assert_matches(reference: dict[str, Any], ranks: list[dict[str, Any]], exact: bool) -> None:
    """Rank 0's logits (and every rank's hidden states) against the single-process run."""
    for name, ref in reference.items():
        driver = ranks[0][name]
        assert "error" not in driver, driver
        for step, (want, got) in enumerate(zip(ref["logits"], driver["logits"], strict=True)):
            assert got.shape == want.shape, (name, step)
            assert torch.equal(got.argmax(-1), want.argmax(-1)), (name, step)
            if exact:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"{name} {step}")
            else:  # int8-rounded activations, summed in another order across ranks
                scale = want.abs().max()
                assert (got - want).abs().max() <= 0.03 * scale, (name, step)
        for rank in ranks:
            for want, got in zip(ref["hidden"], rank[name]["hidden"], strict=True):
                tol = 1e-5 if exact else 0.05 * float(want.abs().max())
                torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=name)


def _assert_reads_its_share(reference: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
    """Each rank read about 1/N of the file's tensor bytes (norms are read by every rank)."""
    n = len(ranks)
    for name, ref in reference.items():
        total = ref["bytes"]
        read = [rank[name]["bytes"] for rank in ranks]
        assert sum(read) >= total, (name, read, total)
        for r, num_bytes in enumerate(read):
            assert abs(num_bytes - total / n) <= 0.03 * total, (name, r, read, total)


def test_two_ranks_match_one(models: Callable[..., str], tmp_path: Path) -> None:
    dense = [
        _case("qwen3", models("qwen3")),  # q/k norm, head_dim 32
        _case("llama-bias", models("llama-bias")),  # o_proj / down biases after the reduce
        _case("tied", models("tied")),
        _case("llama3", models("llama3")),  # rope scaling
        _case("phi3", models("phi3")),  # fused q/k/v and gate/up tensors, split per rank
        _case("qwen2-one-kv-head", models("qwen2", num_key_value_heads=1)),  # replicated
        _case("gguf-f32", models("mistral", gguf="F32")),  # llama.cpp's q/k row permutation
        # Dense from Q8_0 blocks with o_proj split mid-block: the covering blocks, trimmed.
        _case("gguf-q8-dense", models("mistral", gguf="Q8_0", num_key_value_heads=2, **SIX_HEADS)),
        # Partial interleaved rope per local head; fused gate_up (and ChatGLM's fused
        # query_key_value) read whole and cut to each rank's rows of every part.
        _case("glm4", models("glm4")),
        _case("chatglm", models("chatglm")),
    ]
    quantized = [
        _case("gguf-q4_0", models("tied", gguf="Q4_0"), "native"),
        _case("gguf-q8_0", models("mistral", gguf="Q8_0"), "native"),
        _case("rtn-int4", models("llama-bias"), "int4"),
        _case("rtn-int8", models("qwen2"), "int8"),
        _case("chatglm-int8", models("chatglm"), "int8"),
        _case("phi3-int8", models("phi3"), "int8"),
    ]
    ranks = run_group(dense + quantized, 2, tmp_path)
    reference = run_single(dense + quantized)
    _assert_matches({c["name"]: reference[c["name"]] for c in dense}, ranks, exact=True)
    _assert_matches({c["name"]: reference[c["name"]] for c in quantized}, ranks, exact=False)
    assert ranks[0]["qwen2-one-kv-head"]["num_local_kv_heads"] == 1
    assert [r["qwen3"]["num_local_kv_heads"] for r in ranks] == [1, 1]
    shared = ("qwen3", "tied", "gguf-q4_0", "gguf-q8-dense")
    _assert_reads_its_share({name: reference[name] for name in shared}, ranks)


def test_two_ranks_match_one_for_mixtures_of_experts(
    models: Callable[..., str], tmp_path: Path
) -> None:
    # Every rank holds every expert's half of the features; one reduce per sparse layer.
    # DeepSeek also splits its latent attention's heads, the latent cache whole on each rank.
    dense = [
        _case("mixtral", models("mixtral")),  # Mixtral's block_sparse_moe.experts.N.w1 names
        _case("qwen2-moe", models("qwen2-moe")),  # shared expert, a dense layer between
        _case("deepseek-v2", models("deepseek-v2")),  # q_proj, group-limited routing
        _case("deepseek-v3", models("deepseek-v3")),  # q latent, sigmoid routing + bias
        # llama.cpp's stacked experts: each rank reads its rows / columns of every expert.
        _case("gguf-mixtral", models("mixtral", gguf="F32")),
        _case("gguf-deepseek-v3", models("deepseek-v3", gguf="F32")),  # kv_b joined, then cut
    ]
    quantized = [
        _case("qwen2-moe-int8", models("qwen2-moe"), "int8"),
        _case("deepseek-v3-int8", models("deepseek-v3"), "int8"),
        # Expert features 128 -> 64 a rank: down's columns split on Q8_0's 32-value blocks.
        _case("gguf-mixtral-q8_0", models("mixtral", gguf="Q8_0"), "native"),
    ]
    ranks = run_group(dense + quantized, 2, tmp_path)
    reference = run_single(dense + quantized)
    _assert_matches({c["name"]: reference[c["name"]] for c in dense}, ranks, exact=True)
    _assert_matches({c["name"]: reference[c["name"]] for c in quantized}, ranks, exact=False)
    shared = ("mixtral", "qwen2-moe", "gguf-mixtral", "gguf-mixtral-q8_0")
    _assert_reads_its_share({name: reference[name] for name in shared}, ranks)
    assert [r["deepseek-v3"]["num_local_kv_heads"] for r in ranks] == [1, 1]  # the latent


def test_expert_features_that_cannot_split_are_refused(models: Callable[..., str]) -> None:
    config = load_model_source(models("qwen2-moe")).config
    assert config.moe is not None
    config = replace(config, moe=replace(config.moe, expert_intermediate_size=63))
    model_cls = resolve_model_class(config.architecture)
    with torch.device("meta"), pytest.raises(ValueError, match="`tensor_parallel_size` 2") as err:
        model_cls(config, None, ParallelState(1, 2))
    assert "`experts` intermediate size (63) must divide evenly" in str(err.value)
    with pytest.raises(ValueError, match="`tensor_parallel_size` 4") as err:
        expert_slice(64, "experts", ParallelState(1, 4), "int4")
    assert "`experts.down_proj`: each rank's 16 input columns" in str(err.value)
    assert expert_slice(64, "experts", ParallelState(1, 4), "int8") == TensorSlice(0, 16, 32)


def test_three_ranks_match_one(models: Callable[..., str], tmp_path: Path) -> None:
    # Vocabulary 320 splits into padded ranges of 112 rows (the last one 96 rows + padding).
    dense = [
        _case("six-heads", models("mistral", num_key_value_heads=3, **SIX_HEADS)),
        _case("six-heads-tied", models("tied", num_key_value_heads=6, **SIX_HEADS)),
    ]
    quantized = [
        _case(
            "gguf-q4_0",
            models("mistral", gguf="Q4_0", num_key_value_heads=3, **SIX_HEADS),
            "native",
        )
    ]
    ranks = run_group(dense + quantized, 3, tmp_path)
    reference = run_single(dense + quantized)
    _assert_matches({c["name"]: reference[c["name"]] for c in dense}, ranks, exact=True)
    _assert_matches({c["name"]: reference[c["name"]] for c in quantized}, ranks, exact=False)
    assert [r["six-heads"]["num_local_kv_heads"] for r in ranks] == [1, 1, 1]
    _assert_reads_its_share({"six-heads": reference["six-heads"]}, ranks)


@pytest.mark.parametrize(
    ("sizes", "world_size", "quantization", "message"),
    [
        ({}, 3, None, "`num_attention_heads` (4) must divide evenly"),
        ({**SIX_HEADS, "num_key_value_heads": 3}, 2, None, "`num_key_value_heads` (3)"),
        ({"intermediate_size": 129}, 2, None, "`intermediate_size` (129)"),
        ({}, 4, "int4", "`self_attn.o_proj`: each rank's 16 input columns"),
        ({"intermediate_size": 96}, 2, "native", "`mlp.down_proj`: each rank's 48 input"),
        # head_dim 8: each rank's q/k/v rows (3 + 3 + 3 heads of 8) are 72, not a multiple of 16.
        (
            {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 6},
            2,
            "int4",
            "`self_attn.qkv_proj`: each rank's 72 output rows",
        ),
    ],
)
def test_shapes_that_cannot_split_are_refused(
    models: Callable[..., str],
    sizes: dict[str, Any],
    world_size: int,
    quantization: str | None,
    message: str,
) -> None:
    config = load_model_source(models("llama3", **sizes)).config
    with torch.device("meta"), pytest.raises(ValueError, match="`tensor_parallel_size`") as err:
        LlamaForCausalLM(config, quantization, ParallelState(1, world_size))
    assert message in str(err.value)


def test_int8_splits_where_int4_cannot(models: Callable[..., str]) -> None:
    config = load_model_source(models("llama3")).config
    with torch.device("meta"):
        model = LlamaForCausalLM(config, "int8", ParallelState(3, 4))
    assert model.num_local_kv_heads == 1  # 2 KV heads for 4 ranks: replicated
    assert model.layout.kv_heads == (1, 2)


def test_gguf_refuses_a_quantized_slice_inside_a_block(models: Callable[..., str]) -> None:
    source = load_model_source(models("mistral", gguf="Q4_0"))
    name = "model.layers.0.mlp.down_proj.weight"
    plan = ShardPlan(1, 2, {name: TensorSlice(1, 48, 96)})
    with pytest.raises(ValueError, match="`tensor_parallel_size` 2 cannot split") as err:
        list(source.iter_weights(torch.bfloat16, keep_quantized=True, shard=plan))
    assert "Q4_0 blocks of 32 values" in str(err.value)
    dense = dict(source.iter_weights(torch.float32, shard=plan))  # dense: trimmed blocks
    whole = dict(source.iter_weights(torch.float32))
    torch.testing.assert_close(dense[name], whole[name][:, 48:96], rtol=0, atol=0)


def test_safetensors_slices_read_only_their_bytes(models: Callable[..., str]) -> None:
    source = load_model_source(models("qwen2"))
    whole = dict(source.iter_weights(torch.float32))
    total = source.num_bytes_read
    name = "model.layers.1.self_attn.o_proj.weight"
    plan = ShardPlan(0, 2, {name: TensorSlice(1, 16, 48)})
    source.num_bytes_read = 0
    sliced = dict(source.iter_weights(torch.float32, shard=plan))
    assert torch.equal(sliced[name], whole[name][:, 16:48])
    assert source.num_bytes_read == total - whole[name].nbytes // 2
