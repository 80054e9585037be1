"""LoRA adapters compose with every request feature: beam search, best_of, seeded sampling
with logprobs, prompt logprobs, structured output and n-gram speculative decoding each give,
on an adapter, what they give on the base model with that adapter merged into its weights
(PEFT's ``merge_and_unload``: the same function of the input, so the same tokens in float32,
logprobs within float rounding)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from ferrollm import LLM, LoRARequest, SamplingParams
from ferrollm.engine.request import EngineRequest, token_id_array
from tiny_lora import make_adapter
from tiny_models import build_tiny_model

OPTIONS: dict[str, Any] = {"dtype": "float32", "max_num_seqs": 8, "kv_cache_memory": "8MiB"}
PROMPTS = [[5, 17, 42, 99, 3, 250, 8], [300, 11, 64, 7, 128], [9, 8, 7, 9, 8, 7, 9, 8, 7]]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTER = LoRARequest("a", 1)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The base, an adapter of it, and the base with the adapter merged in."""
    import peft
    import transformers

    root = tmp_path_factory.mktemp("lora-features")
    base = build_tiny_model("qwen2", root / "base")
    adapter = make_adapter(base, root / "adapter", 3, r=8, lora_alpha=16, target_modules=TARGETS)
    hf = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(hf, adapter).merge_and_unload()
    merged.save_pretrained(root / "merged")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(base / name, root / "merged" / name)
    return base, adapter, root / "merged"


@pytest.fixture(scope="module", params=[None, "ngram"], ids=["plain", "ngram"])
def engines(request: pytest.FixtureRequest, dirs: tuple[Path, Path, Path]) -> tuple[LLM, LLM]:
    """(engine on base + adapter, engine on the merged model), alike otherwise."""
    base, adapter, merged = dirs
    options = {**OPTIONS, "speculative": request.param}
    with_adapter = LLM(base, enable_lora=True, lora_modules=[f"a={adapter}"], **options)
    return with_adapter, LLM(merged, **options)


def _same(ours: list[Any], theirs: list[Any], logprobs: bool = False) -> None:
    for a, b in zip(ours, theirs, strict=True):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
        if logprobs:
            for ca, cb in zip(a.outputs, b.outputs, strict=True):
                got = [t.logprob for t in ca.logprobs]
                want = [t.logprob for t in cb.logprobs]
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
        SamplingParams(use_beam_search=True, best_of=3, n=2, max_tokens=8),
        SamplingParams(temperature=1.0, best_of=3, n=1, seed=7, max_tokens=8),
        SamplingParams(temperature=0.8, seed=11, logprobs=2, max_tokens=8, ignore_eos=True),
    ],
    ids=["greedy", "beam", "best_of", "seeded-logprobs"],
)
def test_features_on_an_adapter_equal_the_merged_model(engines: Any, params: Any) -> None:
    with_adapter, merged = engines
    logprobs = params.logprobs is not None
    _same(
        with_adapter.generate(PROMPTS, params, ADAPTER), merged.generate(PROMPTS, params), logprobs
    )


def test_prompt_logprobs_on_an_adapter_equal_the_merged_model(engines: Any) -> None:
    with_adapter, merged = engines
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)
    ours, theirs = with_adapter.generate(PROMPTS, params, ADAPTER), merged.generate(PROMPTS, params)
    for a, b in zip(ours, theirs, strict=True):
        got = [None if p is None else p.logprob for p in a.prompt_logprobs]
        want = [None if p is None else p.logprob for p in b.prompt_logprobs]
        assert got[0] is None and want[0] is None
        torch.testing.assert_close(got[1:], want[1:], rtol=1e-4, atol=1e-4)


def test_structured_output_on_an_adapter_equals_the_merged_model(engines: Any) -> None:
    with_adapter, merged = engines
    outputs = []
    for llm, lora in ((with_adapter, "a"), (merged, None)):
        engine = llm.engine
        grammar = engine.grammar_compiler.compile("regex", "(ab|cd)+x", "regex")
        params = SamplingParams(temperature=0, max_tokens=12)
        ids = token_id_array(PROMPTS[0])
        engine.add_request(EngineRequest(f"g-{lora}", ids, params, grammar=grammar, lora=lora))
        finished = None
        while finished is None:
            for out in engine.step():
                if out.request_id == f"g-{lora}" and getattr(out, "finished", False):
                    finished = out
        outputs.append(finished.outputs[0])
    assert outputs[0].token_ids == outputs[1].token_ids
    assert outputs[0].text.endswith("x")
