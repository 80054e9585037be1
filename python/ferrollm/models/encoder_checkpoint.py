"""Reading a media encoder's tensors out of a media-text checkpoint (the vision tower and
connector of an image-text model, the audio tower and projector of an audio-text one), beside
the decoder's, which the ordinary loader reads (``ferrollm.models.media_text``)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from safetensors import safe_open


def encoder_tensors(
    directory: Path, own_prefixes: tuple[str, ...], base_prefix: str = "model."
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a safetensors checkpoint in ``directory`` (one file or an index of
    shards) whose names, less an optional ``base_prefix``, start with one of
    ``own_prefixes``; the others (the decoder's) are never read."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    elif (directory / "model.safetensors").is_file():
        with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
            weight_map = dict.fromkeys(f.keys(), "model.safetensors")
    else:
        raise FileNotFoundError(
            f"no model.safetensors or model.safetensors.index.json in {str(directory)!r}"
        )
    by_file: dict[str, list[str]] = {}
    for name, file_name in weight_map.items():
        if name.removeprefix(base_prefix).startswith(own_prefixes):
            by_file.setdefault(file_name, []).append(name)
    for file_name, names in sorted(by_file.items()):
        with safe_open(str(directory / file_name), framework="pt") as f:
            for name in names:
                yield name, f.get_tensor(name)


def refuse_missing(what: str, missing: Sequence[str]) -> None:
    """ValueError naming (the first few of) the ``missing`` tensors of the ``what`` encoder
    ("vision", "audio"); nothing when none is missing."""
    if missing:
        shown = ", ".join(missing[:5])
        raise ValueError(
            f"checkpoint lacks {len(missing)} {what} tensors the model needs: {shown}"
            + (" ..." if len(missing) > 5 else "")
        )
