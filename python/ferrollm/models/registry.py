"""From a checkpoint's ``architectures`` name to the model class that runs it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

import torch

from ferrollm.distributed.state import SINGLE, ParallelState
from ferrollm.models.config import SUPPORTED_ARCHITECTURES, resolve_architecture
from ferrollm.models.deepseek import DeepseekConfigLike, DeepseekForCausalLM
from ferrollm.models.gemma import GemmaConfigLike, GemmaForCausalLM
from ferrollm.models.glm import (
    ChatGlmForCausalLM,
    Glm4ForCausalLM,
    GlmConfigLike,
    GlmForCausalLM,
)
from ferrollm.models.llama import LlamaForCausalLM
from ferrollm.models.moe import MoeConfigLike, MoeForCausalLM
from ferrollm.models.phi3 import Phi3ConfigLike, Phi3ForCausalLM

#: Architectures with a model class of their own; every other one in ``SUPPORTED_ARCHITECTURES``
#: runs on ``LlamaForCausalLM``, what sets those families apart (biases, q/k norm, sliding
#: window, tied embeddings) resolved into ``ModelConfig``, not into classes.
_OWN_CLASSES: Mapping[str, type[LlamaForCausalLM]] = {
    "Gemma2ForCausalLM": GemmaForCausalLM,
    "Gemma3ForCausalLM": GemmaForCausalLM,
    "MixtralForCausalLM": MoeForCausalLM,
    "Qwen2MoeForCausalLM": MoeForCausalLM,
    "Qwen3MoeForCausalLM": MoeForCausalLM,
    "GlmForCausalLM": GlmForCausalLM,
    "Glm4ForCausalLM": Glm4ForCausalLM,
    "ChatGLMModel": ChatGlmForCausalLM,
    "ChatGLMForConditionalGeneration": ChatGlmForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "DeepseekV2ForCausalLM": DeepseekForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekForCausalLM,
}

#: Architecture name -> model class, for every name of ``SUPPORTED_ARCHITECTURES`` (the one
#: list of architectures).
MODEL_REGISTRY: Mapping[str, type[LlamaForCausalLM]] = MappingProxyType(
    {name: _OWN_CLASSES.get(name, LlamaForCausalLM) for name in SUPPORTED_ARCHITECTURES}
)


def resolve_model_class(architectures: str | Sequence[str]) -> type[LlamaForCausalLM]:
    """The class for the first supported name in ``architectures`` (HF config order).

    Raises ``UnsupportedModelError`` listing the supported architectures.
    """
    return MODEL_REGISTRY[resolve_architecture(architectures)]


class ModelConfigLike(
    GemmaConfigLike, MoeConfigLike, GlmConfigLike, Phi3ConfigLike, DeepseekConfigLike, Protocol
):
    """A model config that also names its architecture."""

    @property
    def architecture(self) -> str: ...


#: Bytes of dense copies a quantized model may keep for batched steps (``QUANTIZED_MAX_ROWS``):
#: a small model keeps them all (SmolLM2-135M: 270 MB in bfloat16); a large one, whose point
#: in quantizing is memory, keeps none.
DENSE_COPY_BUDGET = 1024**3


def build_model(
    config: ModelConfigLike,
    device: torch.device,
    dtype: torch.dtype,
    quantization: str | None = None,
    parallel: ParallelState = SINGLE,
) -> LlamaForCausalLM:
    """An uninitialized model for ``config.architecture`` on ``device`` in ``dtype``.

    ``quantization`` is the linear layers' scheme (``ferrollm.layers.linear.QUANT_MODES``);
    quantized layers keep dense copies within ``DENSE_COPY_BUDGET`` (this rank's share of
    them, when ``parallel`` shards the model).

    Built on the meta device and then allocated once in the target dtype, so no random init
    runs and no float32 copy of a bfloat16 model is ever made. Load weights next.
    """
    cls = resolve_model_class(config.architecture)
    with torch.device("meta"):
        model = cls(config, quantization, parallel)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.set_compute_dtype(dtype, DENSE_COPY_BUDGET)
    model.eval()
    model.requires_grad_(False)
    return model
