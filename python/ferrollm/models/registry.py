"""From a checkpoint's ``architectures`` name to the model class that runs it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ferrollm.models.llama import (
    LlamaConfigLike,
    LlamaForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)

#: Every architecture name ferrollm runs, to its class. SmolLM2 is LlamaForCausalLM with tied
#: embeddings; Mistral is Llama with a sliding window.
MODEL_REGISTRY: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


class UnsupportedArchitectureError(ValueError):
    """No registered model class runs this checkpoint's architecture."""


def supported_architectures() -> list[str]:
    """The architecture names ``resolve_model_class`` accepts, sorted."""
    return sorted(MODEL_REGISTRY)


def resolve_model_class(architectures: str | Sequence[str]) -> type[LlamaForCausalLM]:
    """The class for the first supported name in ``architectures`` (HF config order)."""
    names = [architectures] if isinstance(architectures, str) else list(architectures)
    for name in names:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    raise UnsupportedArchitectureError(
        f"architecture {', '.join(names) or '(none given)'} is not supported; "
        f"supported: {', '.join(supported_architectures())}"
    )


class ModelConfigLike(LlamaConfigLike, Protocol):
    """A model config that also names its architecture."""

    @property
    def architecture(self) -> str: ...


def build_model(
    config: ModelConfigLike, device: torch.device, dtype: torch.dtype
) -> LlamaForCausalLM:
    """An uninitialized model for ``config.architecture`` on ``device`` in ``dtype``.

    Built on the meta device and then allocated once in the target dtype, so no random init
    runs and no float32 copy of a bfloat16 model is ever made. Load weights next.
    """
    cls = resolve_model_class(config.architecture)
    with torch.device("meta"):
        model = cls(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.eval()
    model.requires_grad_(False)
    return model
