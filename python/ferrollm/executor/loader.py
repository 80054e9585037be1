"""Opening a checkpoint: `load_model_source(path)` -> `ModelSource`.

A source is cheap to open (config, tokenizer and metadata only); weights are read later, one
tensor at a time, by `ModelSource.iter_weights`, so a model can be filled in place without ever
holding two copies of its weights. Two formats:

* a Hugging Face directory (``config.json``, ``model.safetensors`` or a sharded index,
  ``tokenizer.json``, ``tokenizer_config.json``, ``generation_config.json``): `loader_hf`;
* a single ``.gguf`` file (llama.cpp), dequantized with the ``gguf`` package: `loader_gguf`.

With ``load_format="dummy"`` a directory opens without its weights (it need hold none):
``ModelSource.dummy_weights`` says so, and `ferrollm.engine.build.load_model` fills the model
with random values instead of reading (``ferrollm.executor.dummy_weights``).
"""

from __future__ import annotations

import os
from pathlib import Path

# Re-exported: callers open checkpoints here and name what they get back from here too.
from ferrollm.executor.source import ModelSource, SpecialTokens
from ferrollm.options import EngineConfigError

__all__ = ["ModelSource", "SpecialTokens", "load_model_source"]


def load_model_source(path: str | os.PathLike[str], load_format: str = "auto") -> ModelSource:
    """Open a Hugging Face model directory or a ``.gguf`` file.

    A directory holding no config.json but exactly one ``.gguf`` file opens that file.
    Raises FileNotFoundError for a missing path and ValueError for an unrecognised layout.
    ``load_format`` is ``EngineConfig.load_format``: "dummy" opens a directory without its
    weights, and refuses a ``.gguf`` file (EngineConfigError naming ``load_format``).
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist")
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) != 1:
            raise ValueError(
                f"model directory {str(path)!r} has no config.json and "
                f"{len(ggufs)} .gguf files; pass a Hugging Face model directory or one .gguf file"
            )
        path = ggufs[0]
    if path.is_dir():
        from ferrollm.executor.loader_hf import HFCheckpoint

        return HFCheckpoint.open(path, dummy_weights=load_format == "dummy")
    if load_format == "dummy":
        raise EngineConfigError(
            "load_format",
            f"`load_format` dummy needs a Hugging Face model directory (config.json and a "
            f"tokenizer); got the file {str(path)!r}",
        )
    if path.suffix == ".gguf":
        from ferrollm.executor.loader_gguf import GGUFCheckpoint

        return GGUFCheckpoint.open(path)
    raise ValueError(
        f"model path {str(path)!r} is neither a directory nor a .gguf file; "
        "pass a Hugging Face model directory or a .gguf file"
    )
