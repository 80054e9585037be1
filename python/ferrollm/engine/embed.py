"""The embedding engine: tokenize, let the Rust scheduler pack inputs into steps, run the
encoder once per step, pool.

Packing is the Rust ``PrefillScheduler``'s (see ``rust/sched/prefill.rs``): waiting inputs are
admitted whole, in rank order (priority, then arrival), while the step's
``max_num_batched_tokens`` tokens and ``max_num_seqs`` seats last; each ends at the ``update``
after its one forward, its KV blocks freed. An input is never split
across steps (an encoder's tokens attend to later ones), so the longest input an embedder takes
is the model's maximum or the step budget, whichever is smaller (``max_input_tokens``); the
server refuses longer ones with a 400. The step's plan is the model's input as is: its
``input_ids`` and ``cu_seqlens_q`` for an encoder (no padding), and its positions, slots and
block tables for a decoder, whose KV lives in blocks of the scheduler's pool for the forward.
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

from ferrollm._core import NewRequest, PrefillScheduler, SchedulerConfig, StepPlan
from ferrollm.engine.embed_decoder import EMBED_BLOCK_SIZE, DecoderEncoder
from ferrollm.models.bert import ENCODER_TYPES, BertModel, load_bert
from ferrollm.models.config import UnsupportedModelError
from ferrollm.models.pooling import POOLING_MODES, EmbedSpec, pool, read_sentence_transformers
from ferrollm.platforms import get_platform
from ferrollm.platforms.host import settle_after_load

#: Token budget of one step when none is given.
DEFAULT_EMBED_BATCHED_TOKENS = 8192
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def embed_scheduler_config(
    max_num_batched_tokens: int, max_num_seqs: int, max_input_tokens: int, max_num_waiting: int
) -> SchedulerConfig:
    """The config of an embedder's ``PrefillScheduler``. Its pool holds enough blocks for any
    step (each input wastes less than one block), so admission never waits for blocks."""
    return SchedulerConfig(
        num_blocks=-(-max_num_batched_tokens // EMBED_BLOCK_SIZE) + max_num_seqs + 1,
        block_size=EMBED_BLOCK_SIZE,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_input_tokens,
        max_num_waiting=max_num_waiting,
        enable_prefix_caching=False,
    )


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
        settle_after_load()  # batches may run on another thread (the server's embedder)
        return cls(model, tokenizer, spec, platform.device, budget, max_num_seqs, root)

    @property
    def dimensions(self) -> int:
        """Length of every embedding."""
        return self.model.config.hidden_size

    @property
    def max_input_tokens(self) -> int:
        """The longest input (specials included) this embedder takes: the model's maximum, or
        the step's token budget when that is smaller (an input is never split across steps)."""
        own = self.model.config.max_input_tokens
        if self.spec.max_seq_length:
            own = min(own, self.spec.max_seq_length)
        return min(own, self.max_num_batched_tokens)

    def scheduler_config(self, max_num_waiting: int = 4096) -> SchedulerConfig:
        """The prefill-only scheduler that packs this embedder's steps."""
        return embed_scheduler_config(
            self.max_num_batched_tokens, self.max_num_seqs, self.max_input_tokens, max_num_waiting
        )

    def encode(self, texts: Sequence[str], truncate: bool = False) -> list[list[int]]:
        """Token ids of ``texts``; cut to ``max_input_tokens`` when ``truncate`` (a longer
        input is otherwise left whole, for the caller to refuse)."""
        ids = self.tokenizer.encode_batch(texts)
        return [self.tokenizer.truncate(i, self.max_input_tokens) for i in ids] if truncate else ids

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """One embedding per input, float32 [len(inputs), dimensions], in input order. Raises
        ``ValidationError`` (naming ``prompt_token_ids``) for an input longer than
        ``max_input_tokens``."""
        out = np.empty((len(inputs), self.dimensions), dtype=np.float32)
        scheduler = PrefillScheduler(self.scheduler_config(max(len(inputs), 1)))
        for i, ids in enumerate(inputs):
            scheduler.add_request(NewRequest(i, ids, arrival_time=0.0))
        while scheduler.has_unfinished_requests():
            plan = scheduler.schedule(0.0)
            if plan.num_rows:
                out[plan.req_ids] = self.run_plan(plan)
            scheduler.update(plan, [])
        return out

    @torch.inference_mode()
    def run_plan(self, plan: StepPlan) -> np.ndarray:
        """One packed forward over the plan's rows (no padding) and their pooled vectors,
        ``[plan.num_rows, dimensions]`` in row order."""
        cu_seqlens = torch.from_numpy(plan.cu_seqlens_q.astype(np.int64))
        if isinstance(self.model, DecoderEncoder):
            hidden = self.model.hidden_states(plan)
        else:
            hidden = self.model(torch.from_numpy(plan.input_ids).to(self.device), cu_seqlens)
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
