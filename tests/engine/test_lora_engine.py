"""LoRA through the engine: ``LLM(enable_lora=True)`` mixes requests on the base and on several
adapters in one batch, each equal (greedy, float32) to transformers + peft's ``generate`` on
the same adapter and to the request run alone; the scheduler's ``max_loras`` holds a request
back until a slot's adapter is done; adapters pin, evict and reload as `LoRAManager` says."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from ferrollm import LLM, SamplingParams
from ferrollm.lora.adapter import LoRAError
from ferrollm.lora.manager import UnknownLoRAError
from ferrollm.lora.request import LoRARequest
from tiny_lora import THREE_ADAPTERS, make_adapter, peft_greedy
from tiny_models import build_tiny_model

PROMPTS = [[5, 17, 42, 99, 3, 250, 8], [300, 11, 64, 7, 128], [9, 8, 7], [1, 2, 3, 4, 5, 6]]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
OPTIONS: dict[str, Any] = {"dtype": "float32", "max_num_seqs": 8, "kv_cache_memory": "8MiB"}
ADAPTERS = THREE_ADAPTERS


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("lora-engine")
    base = build_tiny_model("qwen2", root / "base")
    adapters = {
        name: make_adapter(base, root / name, seed, **config)
        for seed, (name, config) in enumerate(ADAPTERS.items(), start=1)
    }
    return base, adapters


def _hf_greedy(base: Path, adapter: Path | None, prompt: list[int]) -> list[int]:
    return peft_greedy(base, adapter, prompt, GREEDY.max_tokens or 0)


def _modules(adapters: dict[str, Path]) -> list[str]:
    return [f"{name}={path}" for name, path in adapters.items()]


def test_a_mixed_batch_equals_transformers_and_peft_per_request(
    tiny: tuple[Path, dict[str, Path]],
) -> None:
    base, adapters = tiny
    llm = LLM(base, enable_lora=True, max_loras=3, lora_modules=_modules(adapters), **OPTIONS)
    names: list[str | None] = [None, "qv8", "mlp4", "all16"]
    batch = llm.generate(PROMPTS, GREEDY, [None if n is None else LoRARequest(n) for n in names])
    for prompt, name, out in zip(PROMPTS, names, batch, strict=True):
        want = _hf_greedy(base, None if name is None else adapters[name], prompt)
        assert out.outputs[0].token_ids == want, name
        alone = llm.generate([prompt], GREEDY, None if name is None else LoRARequest(name))
        assert alone[0].outputs[0].token_ids == want, name
    # The adapters change the model (so the comparison above means something).
    base_tokens = batch[0].outputs[0].token_ids
    on_adapter = llm.generate([PROMPTS[0]], GREEDY, LoRARequest("all16"))
    assert on_adapter[0].outputs[0].token_ids != base_tokens


def test_more_adapters_than_slots_take_turns(tiny: tuple[Path, dict[str, Path]]) -> None:
    base, adapters = tiny
    llm = LLM(base, enable_lora=True, max_loras=1, lora_modules=_modules(adapters), **OPTIONS)
    names = ["qv8", "mlp4", "all16", "qv8"]
    batch = llm.generate(PROMPTS, GREEDY, [LoRARequest(n) for n in names])
    for prompt, name, out in zip(PROMPTS, names, batch, strict=True):
        assert out.outputs[0].token_ids == _hf_greedy(base, adapters[name], prompt), name


def test_the_prefix_cache_is_never_shared_across_adapters(
    tiny: tuple[Path, dict[str, Path]],
) -> None:
    base, adapters = tiny
    llm = LLM(
        base,
        enable_lora=True,
        max_loras=2,
        lora_modules=_modules(adapters),
        block_size=4,
        **OPTIONS,
    )
    prompt = list(range(3, 40))  # nine full blocks
    want = _hf_greedy(base, adapters["qv8"], prompt)
    base_first = llm.generate([prompt], GREEDY)  # fills the cache with the base's blocks
    on_adapter = llm.generate([prompt], GREEDY, LoRARequest("qv8"))
    assert on_adapter[0].outputs[0].token_ids == want != base_first[0].outputs[0].token_ids
    hits = llm.engine.scheduler.stats()["num_prefix_hit_blocks"]
    again = llm.generate([prompt], GREEDY, LoRARequest("qv8"))  # its own blocks: a hit
    assert again[0].outputs[0].token_ids == want
    assert llm.engine.scheduler.stats()["num_prefix_hit_blocks"] > hits


def test_offline_adapters_load_by_path_and_bad_ones_are_refused(
    tiny: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    base, adapters = tiny
    llm = LLM(base, enable_lora=True, max_loras=1, max_lora_rank=8, **OPTIONS)
    out = llm.generate([PROMPTS[1]], GREEDY, LoRARequest("x", 1, str(adapters["qv8"])))
    assert out[0].outputs[0].token_ids == _hf_greedy(base, adapters["qv8"], PROMPTS[1])
    with pytest.raises(LoRAError, match="all16"):  # rank 16 > max_lora_rank 8
        llm.generate([PROMPTS[1]], GREEDY, LoRARequest("all16", 2, str(adapters["all16"])))
    with pytest.raises(UnknownLoRAError, match="'nope'"):
        llm.generate([PROMPTS[1]], GREEDY, LoRARequest("nope"))
    with pytest.raises(ValueError, match="lora_int_id"):
        llm.generate([PROMPTS[1]], GREEDY, LoRARequest("x", 0))
    plain = LLM(base, **OPTIONS)
    with pytest.raises(ValueError, match="enable_lora"):
        plain.generate([PROMPTS[1]], GREEDY, LoRARequest("x", 1, str(adapters["qv8"])))
    # The engine is left empty after each refusal: the next call runs.
    assert llm.generate([PROMPTS[2]], GREEDY)[0].finished


def test_idle_adapters_beyond_max_cpu_loras_are_dropped_and_read_again(
    tiny: tuple[Path, dict[str, Path]],
) -> None:
    base, adapters = tiny
    llm = LLM(
        base,
        enable_lora=True,
        max_loras=1,
        max_cpu_loras=1,
        lora_modules=_modules(adapters),
        **OPTIONS,
    )
    manager = llm.engine.lora
    assert manager is not None
    held = [n for n in manager.names() if manager._names[n].adapter is not None]
    assert held == ["all16"]  # the last one added; the others were dropped
    out = llm.generate([PROMPTS[0]], GREEDY, LoRARequest("qv8"))  # read again from its path
    assert out[0].outputs[0].token_ids == _hf_greedy(base, adapters["qv8"], PROMPTS[0])
    held = [n for n in manager.names() if manager._names[n].adapter is not None]
    assert held == ["qv8"]


def test_an_adapter_over_a_quantized_gguf_base_keeps_its_greedy_tokens(
    tiny: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    from tiny_gguf import write_tiny_gguf

    base, adapters = tiny
    q8 = write_tiny_gguf(base, tmp_path / "q8.gguf", "qwen2", "Q8_0")
    modules = _modules(adapters)
    quantized = LLM(q8, enable_lora=True, max_loras=3, lora_modules=modules, **OPTIONS)
    layer = quantized.engine.runner.model.model.layers[0]  # type: ignore[attr-defined]
    assert layer.mlp.gate_up_proj.quantized.scheme == "Q8_0"  # the base stays in its blocks
    dense = LLM(base, enable_lora=True, max_loras=3, lora_modules=modules, **OPTIONS)
    # A few tokens: the random tiny model has near-ties that Q8_0's rounding flips later on.
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for name in ADAPTERS:
        ours = quantized.generate(PROMPTS, params, LoRARequest(name))
        theirs = dense.generate(PROMPTS, params, LoRARequest(name))
        for a, b in zip(ours, theirs, strict=True):
            assert a.outputs[0].token_ids == b.outputs[0].token_ids, name


def test_two_ranks_serve_adapters_as_one(tiny: tuple[Path, dict[str, Path]]) -> None:
    # Each rank keeps its share of every A and B; the workers read each adapter from its
    # directory when rank 0 fills a slot, and every step carries its tokens' slots.
    base, adapters = tiny
    options = {**OPTIONS, "enable_lora": True, "max_loras": 2}
    one = LLM(base, lora_modules=_modules(adapters), **options)
    two = LLM(base, tensor_parallel_size=2, lora_modules=_modules(adapters), **options)
    try:
        names = ["qv8", None, "all16", "mlp4"]  # three adapters over two slots: they take turns
        loras = [None if n is None else LoRARequest(n) for n in names]
        want = one.generate(PROMPTS, GREEDY, loras)
        got = two.generate(PROMPTS, GREEDY, loras)
        for name, a, b in zip(names, got, want, strict=True):
            assert a.outputs[0].token_ids == b.outputs[0].token_ids, name
        # An adapter loaded after start-up reaches the workers too.
        late = two.generate([PROMPTS[0]], GREEDY, LoRARequest("late", 1, str(adapters["qv8"])))
        assert late[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    finally:
        two.shutdown()


def test_a_mixture_of_experts_base_takes_attention_adapters_and_refuses_expert_ones(
    tmp_path: Path,
) -> None:
    # The attention projections of a MoE model are adapted as on a dense one; its experts are
    # not adaptable yet, and an adapter with an expert's tensor is refused naming it.
    from safetensors.torch import load_file, save_file

    base = build_tiny_model("mixtral", tmp_path / "moe")
    attention = make_adapter(
        base,
        tmp_path / "attn",
        5,
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj", "o_proj"],
    )
    llm = LLM(base, enable_lora=True, lora_modules=[f"attn={attention}"], **OPTIONS)
    out = llm.generate([PROMPTS[0]], GREEDY, LoRARequest("attn"))
    assert out[0].outputs[0].token_ids == _hf_greedy(base, attention, PROMPTS[0])
    assert out[0].outputs[0].token_ids != llm.generate([PROMPTS[0]], GREEDY)[0].outputs[0].token_ids
    expert = tmp_path / "expert"
    shutil.copytree(attention, expert)
    tensors = load_file(expert / "adapter_model.safetensors")
    name = "base_model.model.model.layers.0.block_sparse_moe.experts.0.w1.lora_A.weight"
    tensors[name] = torch.zeros(8, 64)
    save_file(tensors, expert / "adapter_model.safetensors")
    with pytest.raises(LoRAError, match=r"experts\.0\.w1"):
        llm.generate([PROMPTS[0]], GREEDY, LoRARequest("expert", 2, str(expert)))
