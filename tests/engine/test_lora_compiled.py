"""Compiled decode with LoRA adapters: the graphs built at start-up serve every mix of adapters
and ranks without compiling again, and give what eager gives.

A tiny Qwen2 base, float32 (``compile`` on: the parity mode's compiled graphs match eager's
greedy tokens and logprobs within 1e-4), adapters of ranks 8, 4 and 16 on different targets.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from parity_support import count_compiled_steps
from torch._dynamo.utils import counters

from ferrollm import LLM, SamplingParams
from ferrollm.config import EngineConfigError
from ferrollm.engine import RequestOutput
from ferrollm.executor.compiled_decode import CompiledDecode
from ferrollm.lora.request import LoRARequest
from tiny_lora import make_adapter
from tiny_models import build_tiny_model

PROMPTS = [[5, 17, 42, 99, 3, 250, 8], [300, 11, 64, 7, 128], [9, 8, 7], [1, 2, 3, 4, 5, 6]]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
OPTIONS: dict[str, Any] = {
    "dtype": "float32",
    "max_num_seqs": 4,
    "kv_cache_memory": "4MiB",
    "enable_lora": True,
    "max_loras": 3,
    "max_lora_rank": 16,
}
ADAPTERS = {
    "qv8": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
    "mlp4": {"r": 4, "lora_alpha": 8, "target_modules": ["gate_proj", "up_proj", "down_proj"]},
    "all16": {
        "r": 16,
        "lora_alpha": 32,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"],
    },
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Path]]]:
    root = tmp_path_factory.mktemp("lora-compiled")
    old = os.environ.get("FERROLLM_COMPILE_CACHE")
    os.environ["FERROLLM_COMPILE_CACHE"] = str(root / "inductor")
    base = build_tiny_model("qwen2", root / "base")
    adapters = {
        name: make_adapter(base, root / name, seed, **config)
        for seed, (name, config) in enumerate(ADAPTERS.items(), start=1)
    }
    yield base, adapters
    if old is None:
        del os.environ["FERROLLM_COMPILE_CACHE"]
    else:
        os.environ["FERROLLM_COMPILE_CACHE"] = old


def _tokens_and_logprobs(output: RequestOutput) -> tuple[list[int], torch.Tensor]:
    (completion,) = output.outputs
    assert completion.logprobs is not None
    return completion.token_ids, torch.tensor([lp.logprob for lp in completion.logprobs])


def _requests(adapters: dict[str, Path], names: list[str | None]) -> list[LoRARequest | None]:
    ids = {name: i for i, name in enumerate(ADAPTERS, start=1)}
    return [None if n is None else LoRARequest(n, ids[n], str(adapters[n])) for n in names]


def test_compiled_graphs_serve_every_adapter_mix_as_eager_does(
    tiny: tuple[Path, dict[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, adapters = tiny
    compiled = LLM(base, compile="on", **OPTIONS)
    eager = LLM(base, compile="off", **OPTIONS)
    assert isinstance(compiled.engine.runner.compiled, CompiledDecode)
    rows = count_compiled_steps(compiled, monkeypatch)
    graphs = counters["stats"]["unique_graphs"]
    # The mixes in turn: the base alone, one adapter (rank 8), then a rank-16 adapter that
    # widens every slot's block, then the base and three adapters in one batch.
    mixes: list[list[str | None]] = [
        [None, None, None, None],
        ["qv8", "qv8", None, "qv8"],
        ["all16", None, "all16", None],
        [None, "qv8", "mlp4", "all16"],
    ]
    for names in mixes:
        ours = compiled.generate(PROMPTS, GREEDY, _requests(adapters, names))
        for prompt, name, out in zip(PROMPTS, names, ours, strict=True):
            (alone,) = eager.generate([prompt], GREEDY, _requests(adapters, [name]))
            tokens, logprobs = _tokens_and_logprobs(out)
            want_tokens, want_logprobs = _tokens_and_logprobs(alone)
            assert tokens == want_tokens, (names, name)
            torch.testing.assert_close(logprobs, want_logprobs, atol=1e-4, rtol=0)
    assert 4 in rows  # the graphs ran the decode steps
    assert counters["stats"]["unique_graphs"] == graphs  # and none was compiled again
    # The adapters really changed the output (the graphs did not skip them).
    plain = compiled.generate([PROMPTS[3]], GREEDY)[0].outputs[0].token_ids
    on_all16 = compiled.generate([PROMPTS[3]], GREEDY, _requests(adapters, ["all16"]))
    assert on_all16[0].outputs[0].token_ids != plain


def test_cuda_graphs_with_adapters_are_refused_when_asked_for() -> None:
    from ferrollm.engine.build import _decode_graphs

    class _Device:
        device = torch.device("meta")

    config: Any = type("C", (), {"compile": "on"})()
    with pytest.raises(EngineConfigError, match="LoRA"):
        _decode_graphs(config, _Device(), None, None, None, None, None, object())  # type: ignore[arg-type]
