"""The embedding engine: tokenize, pack inputs into steps by the token budget, run the encoder
once per step, pool.

Why not the Rust scheduler: an encoder step is prefill-only and keeps nothing. There are no KV
blocks to allocate, no decode steps to interleave, no preemption and no prefix cache (attention
is bidirectional, so an input's first block depends on its last token). What is left of
scheduling is the packing itself, ``plan_steps``: consecutive inputs fill a step up to
``max_num_batched_tokens`` tokens and ``max_num_seqs`` inputs, in arrival order. An input
cannot be split across steps (a chunk's tokens attend to later ones), so one longer than the
budget runs alone in its own step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer as HFTokenizer

from ferrollm.engine.embed_decoder import DecoderEncoder
from ferrollm.models.bert import ENCODER_TYPES, BertModel, load_bert
from ferrollm.models.config import UnsupportedModelError
from ferrollm.models.pooling import POOLING_MODES, EmbedSpec, pool, read_sentence_transformers
from ferrollm.platforms import get_platform

#: Token budget of one step when none is given.
DEFAULT_EMBED_BATCHED_TOKENS = 8192
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def plan_steps(lengths: Sequence[int], max_tokens: int, max_seqs: int) -> list[range]:
    """Consecutive groups of inputs, each within ``max_tokens`` tokens and ``max_seqs`` inputs
    (an input longer than ``max_tokens`` gets a step of its own)."""
    steps: list[range] = []
    start, tokens = 0, 0
    for i, n in enumerate(lengths):
        if i > start and (tokens + n > max_tokens or i - start >= max_seqs):
            steps.append(range(start, i))
            start, tokens = i, 0
        tokens += n
    if start < len(lengths):
        steps.append(range(start, len(lengths)))
    return steps


class EmbedTokenizer:
    """``tokenizer.json`` without its padding and truncation (packing needs neither), and the
    split of an input into the specials the post-processor adds around the text."""

    def __init__(self, tokenizer_json: str) -> None:
        self._tok = HFTokenizer.from_str(tokenizer_json)
        self._tok.no_padding()
        self._tok.no_truncation()
        plain = self._tok.encode("a", add_special_tokens=False).ids
        full = self._tok.encode("a", add_special_tokens=True).ids
        self.num_prefix = next(
            (i for i in range(len(full)) if full[i : i + len(plain)] == plain), 0
        )
        self.num_suffix = len(full) - self.num_prefix - len(plain)

    @property
    def vocab_size(self) -> int:
        """Token ids must be below this."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids with the model's special tokens."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=True)]

    def truncate(self, ids: list[int], max_len: int) -> list[int]:
        """``ids`` cut to ``max_len`` tokens keeping the leading and trailing specials (what
        sentence-transformers' truncation does)."""
        if len(ids) <= max_len:
            return ids
        keep = max(max_len - self.num_prefix - self.num_suffix, 0)
        tail = ids[len(ids) - self.num_suffix :] if self.num_suffix else []
        return ids[: self.num_prefix + keep] + tail


@dataclass
class Embedder:
    """An encoder ready to embed: ``embed(list of token-id lists)`` -> float32 [n, dim]."""

    #: A BERT-family encoder, or a Llama-family decoder run prefill-only.
    model: BertModel | DecoderEncoder
    tokenizer: EmbedTokenizer
    spec: EmbedSpec
    device: torch.device
    max_num_batched_tokens: int = DEFAULT_EMBED_BATCHED_TOKENS
    max_num_seqs: int = 256
    model_path: Path | None = None

    @classmethod
    def from_path(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        device: str | None = None,
        dtype: str = "auto",
        pooling: str | None = None,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int = 256,
    ) -> Embedder:
        """Load an encoder from a Hugging Face or sentence-transformers directory (None: the
        default embedding model). ``pooling`` overrides what the directory declares and is
        required when it declares none."""
        if path is None:
            from ferrollm.default_model import default_embedding_model_path

            path = default_embedding_model_path()
        root = Path(path)
        spec = _spec_for(root, pooling)
        encoder_dir = root / spec.transformer_path
        platform = get_platform(device)
        torch_dtype = _embed_dtype(dtype, platform.device.type)
        model: BertModel | DecoderEncoder
        if _model_type(encoder_dir) in ENCODER_TYPES:
            model = load_bert(encoder_dir, platform.device, torch_dtype)
        else:
            model = DecoderEncoder(encoder_dir, platform, torch_dtype)
        tokenizer = EmbedTokenizer((encoder_dir / "tokenizer.json").read_text())
        budget = max_num_batched_tokens or DEFAULT_EMBED_BATCHED_TOKENS
        return cls(model, tokenizer, spec, platform.device, budget, max_num_seqs, root)

    @property
    def dimensions(self) -> int:
        """Length of every embedding."""
        return self.model.config.hidden_size

    @property
    def max_input_tokens(self) -> int:
        """The longest input (specials included) the model takes."""
        own = self.model.config.max_input_tokens
        return min(own, self.spec.max_seq_length) if self.spec.max_seq_length else own

    def encode(self, texts: Sequence[str], truncate: bool = False) -> list[list[int]]:
        """Token ids of ``texts``; cut to ``max_input_tokens`` when ``truncate`` (a longer
        input is otherwise left whole, for the caller to refuse)."""
        ids = self.tokenizer.encode_batch(texts)
        return [self.tokenizer.truncate(i, self.max_input_tokens) for i in ids] if truncate else ids

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """One embedding per input, float32 [len(inputs), dimensions], in input order."""
        out = np.empty((len(inputs), self.dimensions), dtype=np.float32)
        lengths = [len(ids) for ids in inputs]
        for step in plan_steps(lengths, self.max_num_batched_tokens, self.max_num_seqs):
            out[step.start : step.stop] = self.run_step([inputs[i] for i in step])
        return out

    @torch.inference_mode()
    def run_step(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """One packed forward over ``inputs`` (no padding) and the pooled vectors."""
        lengths = [len(ids) for ids in inputs]
        if min(lengths, default=0) < 1:
            raise ValueError("every input needs at least one token")
        flat = np.fromiter((t for ids in inputs for t in ids), dtype=np.int64, count=sum(lengths))
        cu_seqlens = torch.zeros(len(inputs) + 1, dtype=torch.int64)
        cu_seqlens[1:] = torch.cumsum(torch.tensor(lengths), 0)
        input_ids = torch.from_numpy(flat).to(self.device)
        hidden = self.model(input_ids, cu_seqlens)
        return pool(hidden, cu_seqlens, self.spec).cpu().numpy()


def _spec_for(root: Path, pooling: str | None) -> EmbedSpec:
    if pooling is not None and pooling not in POOLING_MODES:
        raise UnsupportedModelError(f"`pooling` must be one of {POOLING_MODES}; got {pooling!r}")
    declared = read_sentence_transformers(root)
    encoder_dir = root / (declared.transformer_path if declared else "")
    if not (encoder_dir / "config.json").is_file():
        raise UnsupportedModelError(
            f"{encoder_dir} has no config.json: the embed task runs Hugging Face directories "
            "(a .gguf file cannot embed)"
        )
    if declared is None:
        if pooling is None:
            raise UnsupportedModelError(
                f"{root} does not declare a pooling (no sentence-transformers modules.json); "
                f"pass `pooling` (one of {POOLING_MODES})"
            )
        return EmbedSpec(pooling=pooling, normalize=True)
    if pooling is not None and pooling != declared.pooling:
        return EmbedSpec(
            pooling, declared.normalize, declared.max_seq_length, declared.transformer_path
        )
    return declared


def _model_type(directory: Path) -> str:
    return str(json.loads((directory / "config.json").read_text()).get("model_type", ""))


def _embed_dtype(dtype: str, device_type: str) -> torch.dtype:
    if dtype == "auto":
        # Encoders are small: float32 on CPU keeps parity with sentence-transformers.
        return torch.float32 if device_type == "cpu" else torch.bfloat16
    if dtype not in _DTYPES:
        raise ValueError(f"`dtype` must be auto or one of {', '.join(_DTYPES)}; got {dtype!r}")
    return _DTYPES[dtype]
