"""Prompt logprobs against transformers (float32 parity mode), through LLM.generate.

Each prompt token after the first gets the raw logprob transformers' forward pass gives it,
its rank and the top alternatives, within 1e-3; also when the prompt prefills in chunks
(a small step budget), when requests are preempted (a tiny KV cache), and when a second
identical prompt would hit the prefix cache (it skips the cache and scores every token).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers  # the oracle

from ferrollm import LLM, SamplingParams
from ferrollm.engine import PromptLogprob, RequestOutput

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. Hello world, hello world!",
    "def f(x): return x * 2",
    "Paris is the capital of France? hello, world: 0123456789 and more words here",
]
NUM_TOP = 3
SCORE = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=NUM_TOP)
#: Whole prompts in one step, prefix caching on.
ROOMY: dict[str, Any] = {"dtype": "float32", "block_size": 4, "enable_prefix_caching": True}
#: A budget of 5 tokens per step (prompts prefill in chunks) and a cache small enough that
#: running requests get preempted and recomputed.
CHUNKED: dict[str, Any] = {
    "dtype": "float32",
    "max_num_batched_tokens": 5,
    "block_size": 4,
    "max_num_seqs": 3,
    "kv_cache_memory": 20 * 2048,
}


class Oracle:
    """transformers' log-softmax over a prompt's positions (float32)."""

    def __init__(self, model_dir: Path) -> None:
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32
        )

    def __call__(self, ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = self.model(torch.tensor([ids])).logits[0]
        return logits.float().log_softmax(-1)


@pytest.fixture(scope="module", params=["llama3", "qwen2"])
def model_dir(request: pytest.FixtureRequest, tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory(request.param)


@pytest.fixture(scope="module")
def oracle(model_dir: Path) -> Oracle:
    return Oracle(model_dir)


def check(out: RequestOutput, oracle: Oracle, num_top: int = NUM_TOP) -> None:
    """``out``'s prompt logprobs equal transformers': logprob, rank and the top ids/values."""
    ids = out.prompt_token_ids
    scores = out.prompt_logprobs
    assert scores is not None and len(scores) == len(ids) and scores[0] is None
    ref = oracle(ids)
    for p in range(1, len(ids)):
        entry = scores[p]
        assert isinstance(entry, PromptLogprob) and entry.token_id == ids[p]
        want = ref[p - 1]
        assert entry.logprob == pytest.approx(want[ids[p]].item(), abs=1e-3), p
        assert entry.rank == int((want > want[ids[p]]).sum()) + 1 or _tied(want, ids[p])
        top_lps, top_ids = want.topk(num_top)
        assert len(entry.top) == num_top
        for (tid, lp), rid, rlp in zip(entry.top, top_ids.tolist(), top_lps.tolist(), strict=True):
            assert lp == pytest.approx(rlp, abs=1e-3)
            assert tid == rid or abs(want[tid].item() - rlp) < 1e-3  # ties may swap


def _tied(logprobs: torch.Tensor, token: int) -> bool:
    """A rank off by near-ties (float32 noise between two implementations) is not a bug."""
    return bool(((logprobs - logprobs[token]).abs() < 1e-4).sum() > 1)


def test_prompt_logprobs_equal_transformers(model_dir: Path, oracle: Oracle) -> None:
    llm = LLM(model_dir, **ROOMY)
    outs = llm.generate(PROMPTS, SCORE)
    for out in outs:
        check(out, oracle)
        assert len(out.outputs[0].token_ids) == 2


def test_prompt_logprobs_under_chunked_prefill_and_preemption(
    model_dir: Path, oracle: Oracle
) -> None:
    llm = LLM(model_dir, **CHUNKED)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=1)
    outs = llm.generate(PROMPTS, params)
    assert llm.engine.scheduler.stats()["num_preemptions"] > 0, "no preemption exercised"
    for out in outs:
        check(out, oracle, num_top=1)


def test_a_prefix_cache_hit_does_not_skip_prompt_scores(model_dir: Path, oracle: Oracle) -> None:
    llm = LLM(model_dir, **ROOMY)
    plain = SamplingParams(temperature=0, max_tokens=1)

    def hits() -> int:
        return int(llm.engine.scheduler.stats()["num_prefix_hit_blocks"])

    llm.generate(PROMPTS[0], plain)  # fills the prefix cache with the prompt's blocks
    before = hits()
    out = llm.generate(PROMPTS[0], SCORE)[0]
    check(out, oracle)
    assert hits() == before, "a request scoring its prompt skips the prefix cache"
    again = llm.generate(PROMPTS[0], plain)[0]
    assert hits() > before, "the prompt's blocks were cached all along"
    assert again.prompt_logprobs is None, "a request that did not ask gets none"


def test_requests_without_prompt_logprobs_get_none(model_dir: Path) -> None:
    llm = LLM(model_dir, **ROOMY)
    outs = llm.generate(
        PROMPTS[:2], [SamplingParams(max_tokens=1), SamplingParams(max_tokens=1, prompt_logprobs=0)]
    )
    assert outs[0].prompt_logprobs is None
    scores = outs[1].prompt_logprobs
    assert scores is not None and all(s is not None and s.top == () for s in scores[1:])
