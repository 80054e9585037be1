"""The media engine's options: ``encoder_cache_memory`` (the encoder cache's budget, taken
from the default KV budget) and where it may be used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from ferrollm import LLM, SamplingParams
from ferrollm.config import DEFAULT_ENCODER_CACHE_MEMORY, EngineConfig, EngineConfigError

GREEDY = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
PICTURE = Image.fromarray(np.random.default_rng(1).integers(0, 256, (90, 200, 3), dtype=np.uint8))


def asks_twice(llm: LLM) -> dict[str, int]:
    prompt = {"prompt": "User: what is in <image> this?", "multi_modal_data": {"image": [PICTURE]}}
    first = llm.generate(prompt, GREEDY)[0]
    assert llm.generate(prompt, GREEDY)[0].outputs[0].token_ids == first.outputs[0].token_ids
    return llm.engine.stats()


@pytest.mark.parametrize(
    ("value", "expected"), [(None, DEFAULT_ENCODER_CACHE_MEMORY), ("0", 0), ("1MiB", 2**20), (7, 7)]
)
def test_sizes(value: Any, expected: int) -> None:
    assert EngineConfig(encoder_cache_memory=value).encoder_cache_bytes == expected


@pytest.mark.parametrize("value", ["-1", "lots", -5, True])
def test_bad_sizes_name_the_option(value: Any) -> None:
    with pytest.raises(EngineConfigError, match=r"encoder_cache_memory.*non-negative") as e:
        EngineConfig(encoder_cache_memory=value)
    assert e.value.field == "encoder_cache_memory"


def test_the_budget_reaches_the_cache(tiny_idefics3_dir: Path) -> None:
    options: dict[str, Any] = {"dtype": "float32", "enable_prefix_caching": False}
    kept = LLM(tiny_idefics3_dir, device="cpu", encoder_cache_memory="1MiB", **options)
    assert kept.engine.encoder_cache is not None
    assert kept.engine.encoder_cache.capacity_bytes == 2**20
    stats = asks_twice(kept)  # the image's tiles are encoded once, then found
    tiles = stats["encoder_cache_misses"]
    assert tiles > 0 and stats["encoder_cache_hits"] == tiles
    assert 0 < stats["encoder_cache_bytes"] <= 2**20
    off = LLM(tiny_idefics3_dir, device="cpu", encoder_cache_memory=0, **options)
    stats = asks_twice(off)  # same tokens, encoded every time
    assert (stats["encoder_cache_misses"], stats["encoder_cache_hits"]) == (2 * tiles, 0)
    assert stats["encoder_cache_bytes"] == 0


def test_a_text_only_model_refuses_the_option(tiny_model_factory: Any) -> None:
    with pytest.raises(EngineConfigError, match="takes text only") as e:
        LLM(tiny_model_factory("llama3"), device="cpu", encoder_cache_memory="1MiB")
    assert e.value.field == "encoder_cache_memory"


def test_the_embedding_task_refuses_the_option() -> None:
    with pytest.raises(EngineConfigError, match="applies to generation") as e:
        EngineConfig(task="embed", encoder_cache_memory="1MiB")
    assert e.value.field == "encoder_cache_memory"
