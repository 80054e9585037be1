"""PEFT adapters on disk: what loads (and how it maps onto our merged layers), and what is
refused, each refusal a LoRAError naming the adapter and the tensor or config field."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from lora_support import PROMPTS, load_ours, ours_last_logits, peft_last_logits
from safetensors.torch import load_file, save_file

from ferrollm.lora.adapter import LoRAError, load_peft_adapter
from ferrollm.lora.layers import attach_lora
from ferrollm.models.llama import LlamaForCausalLM
from tiny_lora import make_adapter

Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
TARGETS = ["q_proj", "v_proj", "down_proj"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_models import build_tiny_model

    return build_tiny_model("qwen2", tmp_path_factory.mktemp("lora-base"))


@pytest.fixture(scope="module")
def model(base: Path) -> LlamaForCausalLM:
    return load_ours(base)


@pytest.fixture(scope="module")
def good(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("good")
    return make_adapter(base, out, 1, r=4, lora_alpha=16, target_modules=TARGETS)


@pytest.fixture
def copy(good: Path, tmp_path: Path) -> Callable[..., Path]:
    """``copy(config=..., tensors=fn)``: the good adapter with its config updated by ``config``
    and its tensors passed through ``fn``."""

    def make(
        config: dict[str, Any] | None = None, tensors: Callable[..., Any] | None = None
    ) -> Path:
        out = tmp_path / "adapter"
        shutil.copytree(good, out)
        if config is not None:
            file = out / "adapter_config.json"
            file.write_text(json.dumps({**json.loads(file.read_text()), **config}))
        if tensors is not None:
            weights = load_file(out / "adapter_model.safetensors")
            tensors(weights)  # in place
            save_file(weights, out / "adapter_model.safetensors")
        return out

    return make


def test_loads_onto_merged_layers_with_scale_folded(good: Path, model: LlamaForCausalLM) -> None:
    adapter = load_peft_adapter("sql", good, model, max_lora_rank=8)
    raw = load_file(good / "adapter_model.safetensors")
    assert adapter.rank == 4 and adapter.name == "sql"
    assert {k[1:] for k in adapter.weights} == {
        ("self_attn.qkv_proj", "q_proj"),
        ("self_attn.qkv_proj", "v_proj"),
        ("mlp.down_proj", "down_proj"),
    }
    q = adapter.weights[(0, "self_attn.qkv_proj", "q_proj")]
    torch.testing.assert_close(q.a, raw[Q_A])
    torch.testing.assert_close(q.b, raw[Q_B] * (16 / 4))  # lora_alpha / r


def test_rslora_scale_and_unknown_keys(copy: Callable[..., Path], model: LlamaForCausalLM) -> None:
    path = copy({"use_rslora": True, "a_key_from_peft_0_99": {"x": 1}, "fan_in_fan_out": False})
    q = load_peft_adapter("rs", path, model, 8).weights[(0, "self_attn.qkv_proj", "q_proj")]
    raw = load_file(path / "adapter_model.safetensors")
    torch.testing.assert_close(q.b, raw[Q_B] * (16 / math.sqrt(4)))


def test_named_adapter_tensors_and_regex_targets(
    copy: Callable[..., Path], model: LlamaForCausalLM
) -> None:
    def rename(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k.replace(".weight", ".default.weight"): v for k, v in weights.items()}

    path = copy({"target_modules": r".*\.(q_proj|v_proj|down_proj)"}, rename)
    assert len(load_peft_adapter("n", path, model, 8).weights) == 3 * 2  # 2 layers


@pytest.mark.parametrize(
    ("config", "tensors", "message"),
    [
        ({}, None, r"`[^`]+\.lora_A\.weight` has rank 4, above `max_lora_rank` 2"),
        ({"use_dora": True}, None, r"`adapter_config.json` sets `use_dora`"),
        ({"bias": "all"}, None, r"field `bias` is 'all'"),
        ({"modules_to_save": ["lm_head"]}, None, r"sets `modules_to_save`"),
        ({"layer_replication": [[0, 2]]}, None, r"sets `layer_replication`"),
        (
            {"target_modules": ["q_proj", "embed_tokens"]},
            None,
            r"`target_modules` names 'embed_tokens'",
        ),
        ({"r": 0}, None, r"field `r` must be a positive integer"),
        ({"peft_type": "IA3"}, None, r"`peft_type` is 'IA3'"),
        (
            None,
            "wrong_shape",
            r"`{Q_B}` has shape \[129, 4\]; the model's q_proj expects \[64, 4\]",
        ),
        (None, "wrong_rank", r"`{Q_A}` has shape \[3, 64\]; the model's q_proj expects \[4, 64\]"),
        (None, "nan", r"`{Q_A}` has non-finite"),
        (None, "no_b", r"`{Q_B}` is missing"),
        (None, "lm_head", r"`base_model.model.lm_head.lora_A.weight` targets a module"),
        (None, "layer_7", r"the model has no layer 7"),
    ],
)
def test_hostile_adapters_are_refused(
    copy: Callable[..., Path],
    model: LlamaForCausalLM,
    config: dict[str, Any] | None,
    tensors: str | None,
    message: str,
) -> None:
    mutate: dict[str, Callable[[dict[str, torch.Tensor]], Any]] = {
        "wrong_shape": lambda w: w.update({Q_B: torch.zeros(129, 4)}),
        "wrong_rank": lambda w: w.update({Q_A: torch.zeros(3, 64)}),
        "nan": lambda w: w[Q_A].view(-1)[5].fill_(float("nan")),
        "no_b": lambda w: w.pop(Q_B),
        "lm_head": lambda w: w.update({"base_model.model.lm_head.lora_A.weight": w[Q_A].clone()}),
        "layer_7": lambda w: w.update(
            {k.replace("layers.0", "layers.7"): v.clone() for k, v in w.items()}
        ),
    }
    path = copy(config, None if tensors is None else mutate[tensors])
    pattern = r"^adapter `bad`: .*" + message.format(Q_A=Q_A, Q_B=Q_B)
    with pytest.raises(LoRAError, match=pattern):
        load_peft_adapter("bad", path, model, max_lora_rank=2 if not config and not tensors else 8)


def test_missing_or_pickled_weights(copy: Callable[..., Path], model: LlamaForCausalLM) -> None:
    path = copy()
    (path / "adapter_model.safetensors").unlink()
    with pytest.raises(
        LoRAError, match=r"adapter `x`: .*adapter_model.safetensors` does not exist"
    ):
        load_peft_adapter("x", path, model, 8)
    torch.save({Q_A: torch.zeros(4, 64)}, path / "adapter_model.bin")
    with pytest.raises(LoRAError, match=r"adapter `x`: only `.*adapter_model.bin` .*pickled"):
        load_peft_adapter("x", path, model, 8)
    (path / "adapter_config.json").unlink()
    with pytest.raises(LoRAError, match=r"adapter `x`: .*adapter_config.json` does not exist"):
        load_peft_adapter("x", path, model, 8)


def test_fused_targets_of_phi3(tmp_path: Path) -> None:
    """Phi-3 checkpoints have one qkv_proj and one gate_up_proj: an adapter on them splits its
    B by rows into our shards and equals peft."""
    from tiny_models import build_tiny_model

    base = build_tiny_model("phi3", tmp_path / "phi3")
    adapter = make_adapter(
        base,
        tmp_path / "a",
        3,
        r=8,
        lora_alpha=16,
        target_modules=["qkv_proj", "gate_up_proj", "o_proj"],
    )
    ours = load_ours(base)
    ours.set_max_model_len(64)  # transformers' short rope factors, as for a short prompt
    state = attach_lora(ours, 1, 8)
    state.load_slot(0, load_peft_adapter("phi", adapter, ours, 8))
    prompt = list(PROMPTS[0])
    want = peft_last_logits(base, adapter, prompt)
    got = ours_last_logits(ours, state, [prompt], [0])[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (want - peft_last_logits(base, None, prompt)).abs().max() > 0.05
