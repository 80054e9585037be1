"""A Llama-family decoder as an embedder: its final hidden states pooled (last token or mean).

The decoder runs through the same model and paged-attention backend as generation, on the
prefill-only scheduler's plan as is: each input's KV goes to the blocks the scheduler gave it
for this step (nothing shared, nothing kept after the step), so causal attention sees exactly
the input's own tokens. The KV cache grows to the highest block the scheduler has handed out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ferrollm.executor.kv_cache import KVCache
from ferrollm.executor.runner import ModelRunner, StepInputs
from ferrollm.platforms import Platform

#: Token slots per KV block of a decoder embedder (the prefill-only scheduler's block size).
EMBED_BLOCK_SIZE = 16


@dataclass(frozen=True)
class DecoderShape:
    """What the embedding engine reads of a model's config."""

    hidden_size: int
    max_input_tokens: int


class DecoderEncoder:
    """``hidden_states(plan)`` -> final hidden states of a prefill-only step."""

    def __init__(self, path: Path, platform: Platform, dtype: torch.dtype) -> None:
        from ferrollm.engine.build import load_model
        from ferrollm.executor.loader import load_model_source

        source = load_model_source(path)
        c = source.config
        self.model = load_model(source, platform.device, dtype)
        self.spec = self.model.kv_cache_spec(EMBED_BLOCK_SIZE, dtype)
        self.config = DecoderShape(c.hidden_size, c.max_position_embeddings)
        self.platform = platform
        self._runner: ModelRunner | None = None

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The model's parameters (for the startup log's dtype)."""
        return self.model.parameters()

    def hidden_states(self, plan: StepInputs) -> torch.Tensor:
        """Final hidden states ``[T, hidden]`` of every token of a prefill-only plan."""
        runner = self._runner_for(int(plan.block_tables.max(initial=0)) + 1)
        return runner.hidden_states(plan)

    def _runner_for(self, num_blocks: int) -> ModelRunner:
        if self._runner is None or self._runner.kv_cache.num_blocks < num_blocks:
            cache = KVCache(self.spec, num_blocks, self.platform.device)
            backend = self.platform.attention_backend()
            self._runner = ModelRunner(
                self.model, cache, self.platform.device, self.spec.dtype, backend
            )
        return self._runner
