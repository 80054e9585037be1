"""TensorRT-LLM's LoRA tensors through the `Executor` (docs/api/trt.md#lora): rows written as
TensorRT-LLM's converter writes a PEFT adapter give the adapter's greedy tokens (those of
``LLM`` with the PEFT directory, itself checked against transformers + peft); the cache rules
one by one; bad rows end the request with an error naming the tensor."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from trt_helpers import ENGINE_OPTIONS, PROMPT, error, tokens

from ferrollm import LLM, LoRARequest, SamplingParams
from ferrollm.trt import Executor
from tiny_lora import make_adapter
from tiny_models import build_tiny_model

#: TensorRT-LLM's module ids, as its converter maps them (docs/api/trt.md#lora).
MODULE_IDS = {"q_proj": 1, "k_proj": 2, "v_proj": 3, "o_proj": 4}
MODULE_IDS |= {"gate_proj": 5, "down_proj": 6, "up_proj": 7}
TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def trt_rows(adapter_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(lora_weights, lora_config)`` of a PEFT adapter: per module and layer, lora_A
    flattened then lora_B times alpha / r flattened, rows zero-padded to the longest."""
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    tensors = load_file(adapter_dir / "adapter_model.safetensors")
    rows, configs = [], []
    for name, a in sorted(tensors.items()):
        if ".lora_A." not in name:
            continue
        b = tensors[name.replace(".lora_A.", ".lora_B.")]
        layer = int(name.split(".layers.")[1].split(".")[0])
        module = name.split(".lora_A.")[0].rsplit(".", 1)[1]
        rows.append(torch.cat([a.flatten(), (b * scale).flatten()]).numpy())
        configs.append([MODULE_IDS[module], layer, a.shape[0]])
    width = max(len(r) for r in rows)
    weights = np.stack([np.pad(r, (0, width - len(r))) for r in rows]).astype(np.float32)
    return weights, np.array(configs, dtype=np.int32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("trt-lora")
    base = build_tiny_model("qwen2", root / "base")
    adapters = [
        make_adapter(base, root / f"a{i}", i, r=4 * i, lora_alpha=8, target_modules=TARGETS)
        for i in (1, 2)
    ]
    return base, adapters


@pytest.fixture(scope="module")
def want(tiny: tuple[Path, list[Path]]) -> list[list[int]]:
    """Greedy tokens of the prompt on each adapter, from the PEFT directories."""
    base, adapters = tiny
    llm = LLM(base, enable_lora=True, **ENGINE_OPTIONS)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    out = [
        llm.generate([PROMPT], greedy, LoRARequest(f"a{i}", 1, str(path)))
        for i, path in enumerate(adapters)
    ]
    llm.shutdown()
    return [o[0].outputs[0].token_ids for o in out]


@pytest.fixture
def executor(tiny: tuple[Path, list[Path]]) -> Iterator[Executor]:
    options: dict[str, Any] = {**ENGINE_OPTIONS, "enable_lora": True, "max_cpu_loras": 1}
    executor = Executor(tiny[0], **options)
    yield executor
    executor.shutdown()


def test_rows_give_the_adapters_tokens_and_the_cache_rules_hold(
    executor: Executor, tiny: tuple[Path, list[Path]], want: list[list[int]]
) -> None:
    _, adapters = tiny
    rows = [trt_rows(a) for a in adapters]
    first = {"lora_task_id": 11, "lora_weights": rows[0][0], "lora_config": rows[0][1]}
    assert tokens(executor, **first) == want[0]
    assert tokens(executor, lora_task_id=11) == want[0]  # cached: the id alone
    assert tokens(executor) != want[0]  # no id: the base model
    # The cache holds one adapter (max_cpu_loras 1): id 12 evicts 11.
    second = {"lora_task_id": 12, "lora_weights": rows[1][0], "lora_config": rows[1][1]}
    assert tokens(executor, **second) == want[1]
    message = error(executor, lora_task_id=11)
    assert "`lora_task_id` 11 is not cached" in message
    # Weights for a cached id replace it.
    replaced = {"lora_task_id": 12, "lora_weights": rows[0][0], "lora_config": rows[0][1]}
    assert tokens(executor, **replaced) == want[0]
    assert tokens(executor, lora_task_id=12) == want[0]


def _with_config(column: int, value: int) -> Any:
    def change(weights: np.ndarray, config: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        config = config.copy()
        config[0, column] = value
        return weights, config

    return change


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (_with_config(0, 9), ["lora_config[0]", "module id 9"]),
        (_with_config(2, 0), ["lora_config[0]", "adapter size 0"]),
        (_with_config(1, 7), ["lora_config[0]", "no layer 7"]),
        (lambda w, c: (w[:, :10], c), ["lora_weights[0]", "values"]),
        (lambda w, c: (w * np.nan, c), ["lora_weights", "non-finite"]),
        (lambda w, c: (w[:1], c), ["lora_weights", "one row per"]),
    ],
)
def test_bad_rows_end_the_request_with_an_error_naming_them(
    executor: Executor, tiny: tuple[Path, list[Path]], change: Any, words: list[str]
) -> None:
    weights, config = change(*trt_rows(tiny[1][0]))
    message = error(executor, lora_task_id=5, lora_weights=weights, lora_config=config)
    for word in words:
        assert word in message, message
    assert "lora_task_id` 5 is not cached" in error(executor, lora_task_id=5)


def test_a_rank_above_the_cap_is_refused(tiny: tuple[Path, list[Path]]) -> None:
    options: dict[str, Any] = {**ENGINE_OPTIONS, "enable_lora": True, "max_lora_rank": 4}
    executor = Executor(tiny[0], **options)
    try:
        weights, config = trt_rows(tiny[1][1])  # rank 8
        message = error(executor, lora_task_id=1, lora_weights=weights, lora_config=config)
        assert "adapter size 8" in message and "max_lora_rank" in message
    finally:
        executor.shutdown()


def test_rows_are_refused_under_tensor_parallelism(tiny: tuple[Path, list[Path]]) -> None:
    # The workers read adapters from directories; rows have none.
    options: dict[str, Any] = {**ENGINE_OPTIONS, "enable_lora": True, "tensor_parallel_size": 2}
    executor = Executor(tiny[0], **options)
    try:
        weights, config = trt_rows(tiny[1][0])
        message = error(executor, lora_task_id=1, lora_weights=weights, lora_config=config)
        assert "`lora_task_id` 1" in message and "tensor_parallel_size" in message
        assert tokens(executor)  # the group goes on
    finally:
        executor.shutdown()
