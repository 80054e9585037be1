"""The Hugging Face directory loader against transformers: config, tokenizer, every weight."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ferrollm.executor import loader_hf
from ferrollm.executor.loader import load_model_source
from ferrollm.models.config import SUPPORTED_ARCHITECTURES, ModelConfig, UnsupportedModelError
from tiny_models import build_tiny_model

# family -> (attention_bias, o_proj_bias, mlp_bias, qk_norm, tie_word_embeddings) the loader
# must derive.
EXPECTED_FLAGS = {
    "llama3": (False, False, False, False, False),
    "mistral": (False, False, False, False, False),
    "qwen2": (True, False, False, False, False),
    "qwen3": (False, False, False, True, False),
    "tied": (False, False, False, False, True),
    "llama-bias": (True, True, True, False, False),
    "phi3": (False, False, False, False, False),
}


def _hf_state_dict(path: Path, **kwargs: Any) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
    return dict(model.state_dict())


def _expected_weights(
    state_dict: dict[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    # A tied model's lm_head is the embedding matrix itself: the loader does not yield it.
    return {
        name: tensor
        for name, tensor in state_dict.items()
        if not (config.tie_word_embeddings and name == "lm_head.weight")
    }


def _assert_same_weights(
    ours: Iterator[tuple[str, torch.Tensor]], expected: dict[str, torch.Tensor]
) -> None:
    loaded = dict(ours)
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype, name
        assert torch.equal(loaded[name], tensor), name


# --- Hugging Face directories -------------------------------------------------------------


def test_hf_config_matches_transformers(tiny_family: str, tiny_model_dir: Path) -> None:
    from transformers import AutoConfig

    config = load_model_source(tiny_model_dir).config
    hf = AutoConfig.from_pretrained(tiny_model_dir)
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "rms_norm_eps",
        "max_position_embeddings",
        "bos_token_id",
        "pad_token_id",
    ):
        assert getattr(config, field) == getattr(hf, field), field
    assert config.architecture == hf.architectures[0]
    assert config.model_type == hf.model_type
    assert config.head_dim == (
        getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    )
    assert config.rope_theta == hf.rope_parameters["rope_theta"]
    hf_scaling = {k: v for k, v in hf.rope_parameters.items() if k != "rope_theta"}
    if hf_scaling["rope_type"] == "default":
        assert config.rope_scaling is None
    elif hf_scaling["rope_type"] == "longrope":  # ours resolves factor and attention_factor
        scaling = config.rope_scaling
        assert scaling is not None
        assert list(scaling.short_factor or ()) == hf_scaling["short_factor"]
        assert list(scaling.long_factor or ()) == hf_scaling["long_factor"]
        original = hf_scaling["original_max_position_embeddings"]
        assert scaling.original_max_position_embeddings == original
        assert scaling.factor == hf.max_position_embeddings / original
        assert config.partial_rotary_factor == hf_scaling["partial_rotary_factor"]
    else:
        assert dict(config.rope_scaling or {}) == hf_scaling
    assert config.eos_token_ids == (2,)
    assert config.dtype == "float32"
    flags = (config.attention_bias, config.o_proj_bias, config.mlp_bias, config.qk_norm)
    assert (*flags, config.tie_word_embeddings) == EXPECTED_FLAGS[tiny_family]


def test_hf_config_flags_agree_with_weights(tiny_model_dir: Path) -> None:
    # The flags the model is built from must predict exactly which tensors the checkpoint has.
    source = load_model_source(tiny_model_dir)
    names = {name for name, _ in source.iter_weights(torch.float32)}
    config = source.config
    assert ("model.layers.0.self_attn.q_proj.bias" in names) == config.attention_bias
    assert ("model.layers.0.self_attn.o_proj.bias" in names) == config.o_proj_bias
    for proj in ("gate_proj", "up_proj", "down_proj"):
        assert (f"model.layers.0.mlp.{proj}.bias" in names) == config.mlp_bias
    assert ("model.layers.0.self_attn.q_norm.weight" in names) == config.qk_norm
    assert ("lm_head.weight" in names) == (not config.tie_word_embeddings)


def test_hf_weights_equal_transformers_state_dict(tiny_model_dir: Path) -> None:
    source = load_model_source(tiny_model_dir)
    expected = _expected_weights(_hf_state_dict(tiny_model_dir), source.config)
    _assert_same_weights(source.iter_weights(torch.float32), expected)


def test_hf_weights_convert_to_the_requested_dtype(tiny_model_factory: Callable[..., Path]) -> None:
    source = load_model_source(tiny_model_factory("qwen3"))
    full = dict(source.iter_weights(torch.float32))
    for name, tensor in source.iter_weights(torch.bfloat16):
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, full[name].to(torch.bfloat16)), name


def test_sharded_checkpoint_streams_one_shard_at_a_time(
    tiny_model_factory: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiny_model_factory("qwen2", max_shard_size="40KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2

    open_now, most_open, opened = 0, 0, []
    real_safe_open = loader_hf.safe_open

    class CountingSafeOpen:
        def __init__(self, file: str, **kwargs: Any) -> None:
            self.inner = real_safe_open(file, **kwargs)
            opened.append(Path(file).name)

        def __enter__(self) -> Any:
            nonlocal open_now, most_open
            open_now += 1
            most_open = max(most_open, open_now)
            return self.inner.__enter__()

        def __exit__(self, *exc: object) -> None:
            nonlocal open_now
            open_now -= 1
            self.inner.__exit__(*exc)

    monkeypatch.setattr(loader_hf, "safe_open", CountingSafeOpen)
    source = load_model_source(path)
    expected = _expected_weights(_hf_state_dict(path), source.config)
    _assert_same_weights(source.iter_weights(torch.float32), expected)
    assert most_open == 1
    assert sorted(opened) == sorted(set(index["weight_map"].values()))  # each shard once


def test_hf_tokenizer_files(tiny_model_dir: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    source = load_model_source(tiny_model_dir)
    hf = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert source.tokenizer_json == (tiny_model_dir / "tokenizer.json").read_text()
    assert source.chat_template == hf.chat_template
    special = source.special_tokens
    assert (special.bos_token, special.bos_token_id) == ("<|im_start|>", 1)
    assert (special.eos_token, special.eos_token_id) == ("<|im_end|>", 2)
    assert (special.pad_token, special.pad_token_id) == ("<|endoftext|>", 0)
    assert special.add_bos_token is False
    text = "What is the capital of France?"
    assert Tokenizer.from_str(source.tokenizer_json).encode(text).ids == hf(text)["input_ids"]


def test_unknown_architecture_lists_supported_ones(
    tiny_model_factory: Callable[..., Path], tmp_path: Path
) -> None:
    path = shutil.copytree(tiny_model_factory("tied"), tmp_path / "gpt2")
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError) as excinfo:
        load_model_source(path)
    message = str(excinfo.value)
    assert "GPT2LMHeadModel" in message
    assert all(name in message for name in SUPPORTED_ARCHITECTURES)


def test_bad_paths_say_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model_source(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_model_source(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"neither a directory nor a \.gguf file"):
        load_model_source(tmp_path / "weights.bin")


def test_chatglm_directory_loads_and_a_custom_code_tokenizer_is_named(tmp_path: Path) -> None:
    # ChatGLM3's original layout: its config keys and tensor names, read through GLM's.
    build_tiny_model("chatglm", tmp_path)
    source = load_model_source(tmp_path)
    assert (source.config.architecture, source.config.partial_rotary_factor) == (
        "ChatGLMModel",
        0.5,
    )
    names = {name for name, _ in source.iter_weights(torch.float32)}
    assert "transformer.encoder.layers.0.self_attention.query_key_value.weight" in names
    assert source.chat_template is not None
    # Its real tokenizer is the repository's own code over tokenizer.model: refused, named.
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenization_chatglm.py").write_text("")
    with pytest.raises(FileNotFoundError, match=r"custom code \(tokenization_chatglm\.py\)"):
        load_model_source(tmp_path)
