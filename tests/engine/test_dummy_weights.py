"""``load_format="dummy"``: a directory of config.json and a tokenizer, no weights, runs."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ferrollm import LLM, SamplingParams
from ferrollm.config import EngineConfig, EngineConfigError
from ferrollm.engine.build import load_model
from ferrollm.executor.dummy_weights import DUMMY_RANGE
from ferrollm.executor.loader import load_model_source
from ferrollm.layers.norm import OffsetRMSNorm, RMSNorm
from ferrollm.preflight import PreflightError, check_serving

SMALL = {"dtype": "float32", "kv_cache_memory": "4MiB", "max_model_len": 64}
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def without_weights(model_dir: Path, directory: Path) -> Path:
    """A copy of ``model_dir`` holding everything but its safetensors files."""
    shutil.copytree(model_dir, directory, ignore=shutil.ignore_patterns("*.safetensors*"))
    assert not list(directory.glob("*.safetensors*"))
    return directory


@pytest.fixture(scope="module")
def shape_only(
    tiny_model_factory: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return without_weights(tiny_model_factory("llama3"), tmp_path_factory.mktemp("d") / "m")


def test_dummy_loads_a_directory_without_weights_and_generates(shape_only: Path) -> None:
    llm = LLM(shape_only, load_format="dummy", **SMALL)
    outputs = llm.generate([[5, 6, 7], [8, 9]], GREEDY)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [6, 6]
    params = dict(llm.engine.runner.model.named_parameters())
    assert params["model.layers.0.input_layernorm.weight"].eq(1.0).all()
    qkv = params["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv.abs().max() <= DUMMY_RANGE and qkv.std() > DUMMY_RANGE / 4
    # Seeded by name: two tensors of one shape differ, and a second load repeats the first.
    down = [params[f"model.layers.{i}.mlp.down_proj.weight"] for i in (0, 1)]
    assert not torch.equal(*down)
    again = LLM(shape_only, load_format="dummy", **SMALL)
    assert torch.equal(qkv, again.engine.runner.model.model.layers[0].self_attn.qkv_proj.weight)
    assert [o.outputs[0].token_ids for o in again.generate([[5, 6, 7], [8, 9]], GREEDY)] == [
        o.outputs[0].token_ids for o in outputs
    ]


def test_auto_still_asks_for_the_weights(shape_only: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no model\.safetensors"):
        LLM(shape_only, **SMALL)


def test_serving_preflight_opens_the_directory_without_weights(shape_only: Path) -> None:
    check_serving(EngineConfig(model=str(shape_only), load_format="dummy"))
    with pytest.raises(PreflightError, match=r"no model\.safetensors"):
        check_serving(EngineConfig(model=str(shape_only)))


def test_offset_norms_get_zero_and_bfloat16_fills_in_its_dtype(
    tiny_model_factory: Callable[..., Path],
) -> None:
    source = load_model_source(tiny_model_factory("gemma2"), "dummy")
    model = load_model(source, torch.device("cpu"), torch.bfloat16)
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert norms and all(isinstance(m, OffsetRMSNorm) for m in norms)
    assert all(m.weight.eq(0.0).all() for m in norms)
    embed = model.model.embed_tokens.weight
    assert embed.dtype == torch.bfloat16 and embed.abs().max() <= DUMMY_RANGE
    assert embed.count_nonzero() > 0.99 * embed.numel()
    assert source.num_bytes_read == 0


def test_bad_values_are_refused_naming_load_format(tmp_path: Path) -> None:
    for options, message in [
        ({"model": str(tmp_path), "load_format": "random"}, "must be one of auto, dummy"),
        ({"load_format": "dummy"}, "the default model"),
        ({"model": "m.gguf", "load_format": "dummy"}, "needs a Hugging Face model directory"),
        ({"model": str(tmp_path), "load_format": "dummy", "quantization": "int8"}, "int8"),
        ({"model": str(tmp_path), "load_format": "dummy", "task": "embed"}, "generation"),
    ]:
        with pytest.raises(EngineConfigError, match=message) as e:
            EngineConfig(**options)  # type: ignore[arg-type]
        assert e.value.field == "load_format"


def test_a_directory_holding_a_gguf_is_refused_naming_load_format(
    tiny_gguf_factory: Callable[[str], Path], tmp_path: Path
) -> None:
    shutil.copy(tiny_gguf_factory("mistral"), tmp_path / "only.gguf")
    with pytest.raises(EngineConfigError, match="got the file") as e:
        LLM(tmp_path, load_format="dummy", **SMALL)
    assert e.value.field == "load_format"


def test_dummy_under_tensor_parallelism_fills_each_rank(shape_only: Path) -> None:
    with LLM(
        shape_only, load_format="dummy", tensor_parallel_size=2, distributed_timeout=30, **SMALL
    ) as llm:
        outputs = llm.generate([[5, 6, 7], [8, 9]], GREEDY)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [6, 6]
