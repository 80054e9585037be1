"""Greedy parity on a GPU: our engine on cuda against transformers on the same GPU.

Every test is marked ``cuda`` (skipped where torch sees no GPU). The engine runs whole
(``LLM(device="cuda")``: the CUDA platform's SDPA paged attention, the KV cache in GPU memory,
logits back to the host for the Rust sampler); the oracle is transformers' greedy ``generate``
on each prompt alone (tests/engine/parity_support.py). Subjects: the default model
(SmolLM2-135M-Instruct, its GGUF dequantized on both sides) and every tiny family of
``TINY_FAMILIES``, each as one batch of prompts of different lengths and as concurrent streams
through AsyncEngine joining at different times.

* float32: tokens equal the reference's, logprobs within 1e-3 (the CPU parity tests' bound);
  a stream's tokens equal its prompt's in the batch.
* bfloat16: per step while the tokens agree, the logprobs of the chosen token and its top 5
  alternatives are no further from the float32 reference than transformers' own bfloat16 run
  is (`assert_bfloat16_as_close_as_transformers`); batches may part from it only at near ties.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from parity_support import (
    Reference,
    assert_bfloat16_as_close_as_transformers,
    assert_matches_reference,
    assert_stream_adds_up,
    run_async,
    stream_outputs,
)

from ferrollm import LLM, SamplingParams
from ferrollm.engine import AsyncEngine, RequestOutput
from tiny_models import TINY_FAMILIES

pytestmark = pytest.mark.cuda

#: Where both sides run.
DEVICE = "cuda"
NUM_NEW_TOKENS = 12
#: Alternatives asked with each bfloat16 token's logprob (compared too).
NUM_TOP = 5
#: Prompts of different lengths (1 to about 40 tokens), the tiny models' and the default's.
TINY_PROMPTS = [
    "Hi",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def f(x): return x * 2",
    "Paris is the capital of France? hello, world: 0123456789",
]
DEFAULT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1, 2, 3,",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
]
#: Streams join at these delays (seconds), so they share steps with prefills and decodes.
DELAYS = [0.0, 0.0, 0.02, 0.05, 0.05]
#: Engine options of every subject: an explicit KV budget (the GPU's default takes 90% of free
#: memory, leaving none for the oracle and the next engine) and a step budget that chunks the
#: longer prompts.
ENGINE = {"kv_cache_memory": "64MiB", "max_num_seqs": 8, "max_num_batched_tokens": 32}
#: The tiny models' context: phi3's long rope then runs its short factors, as transformers
#: does for prompts inside the original 64 positions.
TINY_MAX_MODEL_LEN = 64


@dataclass
class Subject:
    """One model on the GPU: transformers' float32 reference and bfloat16 run, and our engines
    (one per dtype, built on first use)."""

    model: Path
    prompts: list[str]
    reference: Reference
    options: dict[str, Any]
    engines: dict[str, LLM] = field(default_factory=dict)
    _hf_bfloat16: Any = None

    @property
    def hf_bfloat16(self) -> Any:
        """transformers' model in bfloat16 (the float32 one's weights rounded), on the GPU."""
        if self._hf_bfloat16 is None:
            self._hf_bfloat16 = copy.deepcopy(self.reference.model).to(torch.bfloat16)
        return self._hf_bfloat16

    def llm(self, dtype: str) -> LLM:
        """Our engine on the GPU in ``dtype``, dense weights (a GGUF dequantized)."""
        if dtype not in self.engines:
            llm = LLM(self.model, device=DEVICE, dtype=dtype, quantization="none", **self.options)
            runner = llm.engine.runner
            assert runner.device.type == DEVICE and runner.dtype == getattr(torch, dtype)
            self.engines[dtype] = llm
        return self.engines[dtype]


@pytest.fixture(scope="module", params=["default", *TINY_FAMILIES])
def subject(
    request: pytest.FixtureRequest, tiny_model_factory: Callable[..., Path]
) -> Iterator[Subject]:
    name: str = request.param
    if name == "default":
        smollm2_gguf: Path = request.getfixturevalue("smollm2_gguf")  # only this one needs it
        reference = Reference.from_gguf(smollm2_gguf, DEVICE, NUM_NEW_TOKENS)
        subject = Subject(smollm2_gguf, DEFAULT_PROMPTS, reference, dict(ENGINE))
    else:
        model = tiny_model_factory(name)
        reference = Reference.from_dir(model, DEVICE, NUM_NEW_TOKENS)
        options = {**ENGINE, "max_model_len": TINY_MAX_MODEL_LEN}
        subject = Subject(model, TINY_PROMPTS, reference, options)
    yield subject
    subject.engines.clear()  # the next subject's engines get the GPU memory back


def greedy(num_top: int) -> SamplingParams:
    return SamplingParams(
        temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=num_top
    )


def streamed(llm: LLM, prompts: list[str], params: SamplingParams) -> list[RequestOutput]:
    """Each prompt's final output, streamed through AsyncEngine, all at once (`DELAYS`);
    every stream's deltas add up to its final output."""

    async def body(engine: AsyncEngine) -> list[list[RequestOutput]]:
        streams = (
            stream_outputs(engine, p, params, d) for p, d in zip(prompts, DELAYS, strict=True)
        )
        return list(await asyncio.gather(*streams))

    return [assert_stream_adds_up(outputs) for outputs in run_async(llm, body)]


def test_float32_batch_equals_transformers(subject: Subject) -> None:
    outputs = subject.llm("float32").generate(subject.prompts, greedy(0))
    assert len({len(o.prompt_token_ids) for o in outputs}) == len(outputs)  # all lengths differ
    for output in outputs:
        assert_matches_reference(subject.reference, output)


def test_float32_streams_equal_the_batch(subject: Subject) -> None:
    llm = subject.llm("float32")
    batch = llm.generate(subject.prompts, greedy(0))
    for final, expected in zip(streamed(llm, subject.prompts, greedy(0)), batch, strict=True):
        assert final.outputs[0].token_ids == expected.outputs[0].token_ids
        assert final.outputs[0].text == expected.outputs[0].text
        assert_matches_reference(subject.reference, final)


def test_bfloat16_batch_is_as_close_as_transformers(subject: Subject) -> None:
    outputs = subject.llm("bfloat16").generate(subject.prompts, greedy(NUM_TOP))
    assert_bfloat16_as_close_as_transformers(
        subject.reference, subject.hf_bfloat16, outputs, NUM_TOP
    )


def test_bfloat16_streams_are_as_close_as_transformers(subject: Subject) -> None:
    # Not equal to the batch: bfloat16 kernels may round a row differently beside other rows.
    finals = streamed(subject.llm("bfloat16"), subject.prompts, greedy(NUM_TOP))
    assert_bfloat16_as_close_as_transformers(
        subject.reference, subject.hf_bfloat16, finals, NUM_TOP
    )
