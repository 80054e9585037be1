"""DeepSeek-V2/V3 GGUF files (llama.cpp's "deepseek2") against their Hugging Face checkpoints:
the config the file's keys rebuild, every weight (``kv_b_proj`` whole, or joined again from
the newer converter's ``attn_k_b`` / ``attn_v_b``), greedy tokens against transformers, a
Q8_0 file's blocks, and files that cannot load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from parity_support import Reference, assert_matches_reference
from test_loader_gguf import assert_same_config, assert_same_weights

import tiny_gguf_deepseek
from ferrollm import LLM, SamplingParams
from ferrollm.executor.loader import load_model_source
from tiny_gguf_deepseek import KV_B_LAYOUTS, write_tiny_deepseek_gguf

FAMILIES = ["deepseek-v2", "deepseek-v3"]
PROMPTS = ["Hello world", "def f(x): return", "What is the capital of France?"]
NUM_NEW_TOKENS = 8
OPTIONS: dict[str, Any] = {"dtype": "float32", "kv_cache_memory": "4MiB", "max_model_len": 64}


@pytest.mark.parametrize("layout", KV_B_LAYOUTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_deepseek_gguf_loads_as_its_hf_checkpoint(
    family: str, layout: str, tiny_model_factory: Callable[..., Path], tmp_path: Path
) -> None:
    # V2: plain q_proj, softmax, groups ranked by their best, scaled weights, YaRN with its
    # softmax term; V3: the q bottleneck, sigmoid with the correction bias, renormalised.
    hf_dir = tiny_model_factory(family)
    gguf_path = write_tiny_deepseek_gguf(hf_dir, tmp_path / "t.gguf", layout=layout)
    hf_source, gguf_source = load_model_source(hf_dir), load_model_source(gguf_path)
    ours, theirs = gguf_source.config, hf_source.config
    assert (ours.architecture, ours.model_type) == (theirs.architecture, theirs.model_type)
    assert ours.mla is not None and ours.mla == theirs.mla
    assert ours.deepseek_moe is not None and ours.deepseek_moe == theirs.deepseek_moe
    assert_same_config(ours, theirs)
    if family == "deepseek-v2":
        assert ours.rope_scaling is not None and ours.rope_scaling["mscale_all_dim"] == 0.707
    expected = dict(hf_source.iter_weights(torch.float32))
    assert_same_weights(gguf_source.iter_weights(torch.float32), expected, tied=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_deepseek_gguf_decodes_as_its_hf_checkpoint_and_transformers(
    family: str,
    device: str,
    tiny_model_factory: Callable[..., Path],
    tiny_gguf_factory: Callable[[str], Path],
) -> None:
    hf_dir = tiny_model_factory(family)
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=0)
    ours = LLM(tiny_gguf_factory(family), device=device, **OPTIONS).generate(PROMPTS, params)
    theirs = LLM(hf_dir, device=device, **OPTIONS).generate(PROMPTS, params)
    reference = Reference.from_dir(hf_dir, device, NUM_NEW_TOKENS)
    # Ours on the token ids: the file's tokenizer spells the vocabulary's padding ids past
    # the tiny tokenizer's ("[PAD319]"), which transformers' decodes as nothing.
    by_ids = Reference(reference.model, NUM_NEW_TOKENS)
    for a, b in zip(ours, theirs, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert_matches_reference(reference, b)
        assert_matches_reference(by_ids, a)


@pytest.mark.parametrize("layout", KV_B_LAYOUTS)
def test_a_q8_0_deepseek_gguf_keeps_its_blocks_and_its_first_tokens(
    layout: str,
    tiny_model_factory: Callable[..., Path],
    tiny_gguf_factory: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    hf_dir = tiny_model_factory("deepseek-v3")
    q8 = write_tiny_deepseek_gguf(hf_dir, tmp_path / "q8.gguf", "Q8_0", layout)
    quantized, dense = LLM(q8, **OPTIONS), LLM(tiny_gguf_factory("deepseek-v3"), **OPTIONS)
    layer = quantized.engine.runner.model.model.layers[1]  # type: ignore[attr-defined]
    mlp, attn = layer.mlp, layer.self_attn
    experts = [*mlp.experts, mlp.shared_experts]
    for linear in [attn.q_a_proj, attn.o_proj, *(p for e in experts for p in e.children())]:
        assert linear.quantized is not None and linear.quantized.scheme == "Q8_0"
    # Dense, whatever the file holds: the router and its bias, and kv_b_proj (absorbed).
    assert mlp.gate.weight.dtype == torch.float32
    assert attn.kv_b_proj.quantized is None and attn.kv_b_proj.weight is not None
    # A few tokens: the random tiny model has near-ties that Q8_0's rounding flips later on.
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    ours, theirs = quantized.generate(PROMPTS, params), dense.generate(PROMPTS, params)
    for a, b in zip(ours, theirs, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_a_v2_file_without_a_gating_key_is_softmax(
    tiny_model_factory: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first V2 files have no expert_gating_func: llama.cpp reads them as softmax.
    import gguf

    monkeypatch.setattr(gguf.GGUFWriter, "add_expert_gating_func", lambda self, value: None)
    path = write_tiny_deepseek_gguf(tiny_model_factory("deepseek-v2"), tmp_path / "t.gguf")
    config = load_model_source(path).config
    assert config.architecture == "DeepseekV2ForCausalLM"
    assert config.deepseek_moe is not None and config.deepseek_moe.scoring_func == "softmax"


@pytest.mark.parametrize(
    ("skipped", "message"),
    [
        ("add_kv_lora_rank", r"lacks the `deepseek2\.attention\.kv_lora_rank` key"),
        ("add_q_lora_rank", r"lacks the `deepseek2\.attention\.q_lora_rank` key"),
        ("add_expert_count", r"lacks the `deepseek2\.expert_count` key"),
        ("add_rope_scaling_orig_ctx_len", r"`deepseek2\.rope\.scaling\.original_context_len"),
    ],
)
def test_a_file_missing_a_required_key_is_refused_naming_it(
    skipped: str,
    message: str,
    tiny_model_factory: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gguf

    monkeypatch.setattr(gguf.GGUFWriter, skipped, lambda self, value: None)
    family = "deepseek-v2" if "rope" in skipped else "deepseek-v3"
    path = write_tiny_deepseek_gguf(tiny_model_factory(family), tmp_path / "t.gguf")
    with pytest.raises(ValueError, match=message):
        load_model_source(path)


def test_a_split_kv_b_without_its_value_half_is_refused(
    tiny_model_factory: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add = tiny_gguf_deepseek._add

    def without_v_b(writer: Any, name: str, array: Any, quant_type: str | None) -> None:
        if name != "blk.1.attn_v_b.weight":
            add(writer, name, array, quant_type)

    monkeypatch.setattr(tiny_gguf_deepseek, "_add", without_v_b)
    path = write_tiny_deepseek_gguf(tiny_model_factory("deepseek-v3"), tmp_path / "t.gguf")
    source = load_model_source(path)
    with pytest.raises(ValueError, match=r"`blk\.1\.attn_k_b` has no attn_v_b"):
        list(source.iter_weights(torch.float32))
