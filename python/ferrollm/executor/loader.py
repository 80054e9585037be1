"""Opening a checkpoint: `load_model_source(path)` -> `ModelSource`.

A source is cheap to open (config, tokenizer and metadata only); weights are read later, one
tensor at a time, by `ModelSource.iter_weights`, so a model can be filled in place without ever
holding two copies of its weights. Two formats:

* a Hugging Face directory (``config.json``, ``model.safetensors`` or a sharded index,
  ``tokenizer.json``, ``tokenizer_config.json``, ``generation_config.json``): `loader_hf`;
* a single ``.gguf`` file (llama.cpp), dequantized with the ``gguf`` package: `loader_gguf`.
"""

from __future__ import annotations

import abc
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ferrollm.models.config import ModelConfig

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SpecialTokens:
    """The tokenizer's special tokens and how encoding uses them."""

    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    unk_token: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    #: whether ``tokenizer_json``'s post-processor puts BOS first (already applied there).
    add_bos_token: bool


class ModelSource(abc.ABC):
    """A checkpoint opened for loading: its config, tokenizer and a weight stream.

    ``tokenizer_json`` is a complete ``tokenizer.json`` (for ``tokenizers.Tokenizer.from_str``);
    ``chat_template`` is the Jinja chat template, or None when the checkpoint has none.
    """

    def __init__(
        self,
        path: Path,
        config: ModelConfig,
        tokenizer_json: str,
        chat_template: str | None,
        special_tokens: SpecialTokens,
    ) -> None:
        self.path = path
        self.config = config
        self.tokenizer_json = tokenizer_json
        self.chat_template = chat_template
        self.special_tokens = special_tokens

    @abc.abstractmethod
    def iter_weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, tensor)`` one at a time, each converted to ``dtype`` on the CPU.

        Names are transformers' (``model.layers.0.self_attn.q_proj.weight``). A tied model
        yields no ``lm_head.weight``: it reuses ``model.embed_tokens.weight``. Each tensor is
        fresh memory the caller may keep or drop; nothing else holds the weights.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, {self.config.architecture})"


def load_model_source(path: str | os.PathLike[str]) -> ModelSource:
    """Open a Hugging Face model directory or a ``.gguf`` file.

    A directory holding no config.json but exactly one ``.gguf`` file opens that file.
    Raises FileNotFoundError for a missing path and ValueError for an unrecognised layout.
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

        return HFCheckpoint.open(path)
    if path.suffix == ".gguf":
        from ferrollm.executor.loader_gguf import GGUFCheckpoint

        return GGUFCheckpoint.open(path)
    raise ValueError(
        f"model path {str(path)!r} is neither a directory nor a .gguf file; "
        "pass a Hugging Face model directory or a .gguf file"
    )


@contextmanager
def progress_bar(total: int, desc: str) -> Iterator[Callable[[], None]]:
    """A tensor-count progress bar on stderr (drawn only when stderr is a terminal).

    Yields ``tick()``, to call once per tensor; the bar closes when the block exits.
    """
    from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

    bar = tqdm(total=total, desc=desc, unit="tensor", disable=not sys.stderr.isatty())
    try:
        yield lambda: bar.update(1)
    finally:
        bar.close()
