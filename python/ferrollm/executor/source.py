"""What every checkpoint format opens into: `ModelSource` and its `SpecialTokens`.

Split from `ferrollm.executor.loader` so the format modules (`loader_hf`, `loader_gguf`) and the
dispatcher that picks one of them all import this module and none imports another: the
dependency runs one way, ``loader -> loader_hf/loader_gguf -> source``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ferrollm.distributed.shard_plan import WHOLE, ShardPlan
from ferrollm.models.config import ModelConfig

if TYPE_CHECKING:
    import torch

    from ferrollm.layers.linear import Weight


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
        dummy_weights: bool = False,
        vision_family: str | None = None,
    ) -> None:
        self.path = path
        self.config = config
        self.tokenizer_json = tokenizer_json
        self.chat_template = chat_template
        self.special_tokens = special_tokens
        #: Bytes of tensor data read from the file so far (what a shard plan saves shows here).
        self.num_bytes_read = 0
        #: Opened with ``load_format`` dummy: there is nothing to read (``iter_weights`` yields
        #: nothing), and the model is filled with random values instead.
        self.dummy_weights = dummy_weights
        #: The media-text family whose text decoder this source's weights are ("idefics3",
        #: "qwen2_audio": its media encoder loads beside it, ``ferrollm.multimodal.build``),
        #: or None. (Named for the first family, an image one; audio families use it too.)
        self.vision_family = vision_family

    @property
    def is_quantized(self) -> bool:
        """Whether the file stores weight matrices quantized (a GGUF Q4_1, say)."""
        return False

    @abc.abstractmethod
    def iter_weights(
        self, dtype: torch.dtype, keep_quantized: bool = False, shard: ShardPlan = WHOLE
    ) -> Iterator[tuple[str, Weight]]:
        """Yield ``(hf_name, tensor)`` one at a time, each converted to ``dtype`` on the CPU.

        Names are transformers' (``model.layers.0.self_attn.q_proj.weight``). A tied model
        yields no ``lm_head.weight``: it reuses ``model.embed_tokens.weight``. Each tensor is
        fresh memory the caller may keep or drop; nothing else holds the weights. With
        ``keep_quantized``, a tensor the file stores quantized comes as `GgmlBlocks` instead
        (never dequantized whole); formats that only store dense tensors ignore it.

        ``shard`` names the slice of each tensor to read (a tensor-parallel rank's share): only
        those bytes are read from the file, and the tensor yielded is the slice. A slice the
        format cannot cut (inside a quantized block) raises ValueError naming
        ``tensor_parallel_size`` and the tensor.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, {self.config.architecture})"
