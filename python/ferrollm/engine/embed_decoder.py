"""A Llama-family decoder as an embedder: its final hidden states pooled (last token or mean).

The decoder runs through the same model and paged-attention backend as generation, but
prefill-only: each step's inputs are laid out in a scratch KV cache that only lives for the
step (block ``b + 1`` onwards for each input, nothing shared, nothing kept), so causal
attention sees exactly the input's own tokens. The scratch cache grows to the largest step
seen; it is not the generation engine's cache and no scheduler is involved.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ferrollm.executor.kv_cache import KVCache, KVCacheSpec
from ferrollm.executor.runner import ModelRunner, SyntheticPlan
from ferrollm.platforms import Platform


@dataclass(frozen=True)
class DecoderShape:
    """What the embedding engine reads of a model's config."""

    hidden_size: int
    max_input_tokens: int


class DecoderEncoder:
    """``forward(input_ids, cu_seqlens)`` -> final hidden states, like ``BertModel``."""

    def __init__(self, path: Path, platform: Platform, dtype: torch.dtype) -> None:
        from ferrollm.engine.engine import load_model
        from ferrollm.executor.loader import load_model_source

        source = load_model_source(path)
        c = source.config
        self.model = load_model(source, platform.device, dtype)
        self.spec = KVCacheSpec(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 16, dtype)
        self.config = DecoderShape(c.hidden_size, c.max_position_embeddings)
        self.platform = platform
        self._runner: ModelRunner | None = None

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The model's parameters (for the startup log's dtype)."""
        return self.model.parameters()

    def __call__(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        cu = cu_seqlens.numpy()
        lens = cu[1:] - cu[:-1]
        bs = self.spec.block_size
        blocks_per = -(-lens // bs)
        first = 1 + np.concatenate([[0], np.cumsum(blocks_per)[:-1]])  # block 0 is null
        runner = self._runner_for(int(blocks_per.sum()) + 1)
        positions = np.concatenate([np.arange(n) for n in lens]).astype(np.int64)
        row = np.repeat(np.arange(len(lens)), lens)
        table = np.zeros((len(lens), int(blocks_per.max())), dtype=np.int32)
        for i, (start, n) in enumerate(zip(first, blocks_per, strict=True)):
            table[i, :n] = np.arange(start, start + n)
        plan = SyntheticPlan(
            input_ids=input_ids.cpu().numpy(),
            positions=positions,
            slot_mapping=(first[row] * bs + positions).astype(np.int64),
            cu_seqlens_q=cu.astype(np.int32),
            context_lens=lens.astype(np.int32),
            block_tables=table,
            logits_indices=np.zeros(0, dtype=np.int64),
            block_copies=np.zeros((0, 2), dtype=np.int32),
        )
        return runner.hidden_states(plan)

    def _runner_for(self, num_blocks: int) -> ModelRunner:
        if self._runner is None or self._runner.kv_cache.num_blocks < num_blocks:
            cache = KVCache(self.spec, num_blocks, self.platform.device)
            backend = self.platform.attention_backend()
            self._runner = ModelRunner(
                self.model, cache, self.platform.device, self.spec.dtype, backend
            )
        return self._runner
