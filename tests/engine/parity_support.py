"""The transformers oracle of the engine parity tests, and the AsyncEngine drivers they share.

The reference is transformers' greedy ``generate`` on each prompt alone, on the device the
test runs on (``--device``, or "cuda" in test_cuda_parity). In float32 our tokens must equal
its tokens and our logprobs be within `FLOAT32_ATOL`; in bfloat16 our logprobs must stay within
`BFLOAT16_ATOL` of the float32 reference (`assert_close_in_bfloat16`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers  # the oracle; pinned in requirements/dev.txt, so never skipped

from ferrollm import LLM, SamplingParams
from ferrollm.engine import AsyncEngine, RequestOutput

#: Logprobs of our float32 engine against transformers' float32 (absolute, nats).
FLOAT32_ATOL = 1e-3
#: Logprobs of our bfloat16 engine against transformers' float32: what
#: test_model_parity.test_bfloat16_stays_close_to_float32 holds the tiny models to.
BFLOAT16_ATOL = 0.1


def as_oracle(model: Any, device: str) -> Any:
    """``model`` (a transformers causal LM) in eval mode on ``device``, generating past EOS."""
    model = model.to(device).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def hf_greedy(model: Any, prompt: Sequence[int], num_new_tokens: int) -> tuple[list[int], Any]:
    """transformers' greedy tokens after ``prompt`` (alone, EOS ignored), and the float32
    log-softmax ``[num_new_tokens, vocab]`` of each step, on the CPU."""
    ids = torch.tensor([list(prompt)], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=num_new_tokens,
        output_logits=True,
        return_dict_in_generate=True,
    )
    tokens = out.sequences[0, ids.shape[1] :].tolist()
    return tokens, torch.cat(out.logits).float().log_softmax(-1).cpu()


class Reference:
    """transformers' greedy tokens and per-step log-softmax for one model (memoized).

    Text prompts are encoded with ``tokenizer`` (transformers'); without one, prompts are
    token ids."""

    def __init__(self, model: Any, num_new_tokens: int, tokenizer: Any = None) -> None:
        self.model = model
        self.num_new_tokens = num_new_tokens
        self.tokenizer = tokenizer
        self._cache: dict[tuple[int, ...], tuple[list[int], torch.Tensor]] = {}

    @classmethod
    def from_dir(cls, model_dir: Path, device: str, num_new_tokens: int) -> Reference:
        """The float32 oracle of a saved model directory (with its tokenizer) on ``device``."""
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        return cls(as_oracle(model, device), num_new_tokens, tokenizer)

    @classmethod
    def from_gguf(cls, path: Path, device: str, num_new_tokens: int) -> Reference:
        """The float32 oracle of a ``.gguf`` file (transformers dequantizes it) on ``device``;
        prompts are token ids."""
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        )
        return cls(as_oracle(model, device), num_new_tokens)

    def encode(self, prompt: str) -> list[int]:
        ids: list[int] = self.tokenizer(prompt)["input_ids"]
        return ids

    def __call__(self, prompt: str | Sequence[int]) -> tuple[list[int], torch.Tensor]:
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        key = tuple(ids)
        if key not in self._cache:
            self._cache[key] = hf_greedy(self.model, ids, self.num_new_tokens)
        return self._cache[key]


def _reference_prompt(reference: Reference, output: RequestOutput) -> str | Sequence[int]:
    """What the reference is asked: the prompt text through transformers' tokenizer when it
    has one (so its encoding is checked too), else our prompt's token ids."""
    if reference.tokenizer is not None:
        assert output.prompt is not None
        return output.prompt
    return output.prompt_token_ids


def assert_matches_reference(
    reference: Reference, output: RequestOutput, atol: float = FLOAT32_ATOL
) -> None:
    """A finished greedy output (``max_tokens`` = the reference's, EOS ignored, logprobs asked)
    has the reference's tokens, and its logprobs are within ``atol`` of the reference's."""
    tokens, logprobs = reference(_reference_prompt(reference, output))
    (completion,) = output.outputs
    assert completion.token_ids == tokens, output.prompt
    assert completion.finish_reason == "length"
    assert completion.logprobs is not None
    ours = torch.tensor([lp.logprob for lp in completion.logprobs])
    expected = logprobs.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
    torch.testing.assert_close(ours, expected, atol=atol, rtol=0)
    if reference.tokenizer is not None:
        assert completion.text == reference.tokenizer.decode(tokens, skip_special_tokens=True)


def assert_close_in_bfloat16(
    reference: Reference, output: RequestOutput, atol: float = BFLOAT16_ATOL
) -> int:
    """A bfloat16 greedy output (logprobs with top alternatives asked) against the float32
    reference; returns how many leading tokens agree.

    At each step while the tokens agree, our logprobs of the chosen token and of its top
    alternatives are within ``atol`` of the reference's. Where the tokens part, the reference
    must have been a near tie (its token at most ``2 * atol`` above ours: both sides within
    ``atol`` cannot order two tokens further apart differently); past that point the contexts
    differ and nothing more is compared.
    """
    tokens, logprobs = reference(_reference_prompt(reference, output))
    (completion,) = output.outputs
    assert completion.logprobs is not None
    for step, (ours, want) in enumerate(zip(completion.logprobs, tokens, strict=True)):
        row = logprobs[step]
        ids = [ours.token_id, *(t for t, _ in ours.top)]
        values = torch.tensor([ours.logprob, *(v for _, v in ours.top)])
        torch.testing.assert_close(
            values, row[ids], atol=atol, rtol=0, msg=lambda m, s=step: f"step {s}: {m}"
        )
        if ours.token_id != want:
            gap = float(row[want] - row[ours.token_id])
            assert gap <= 2 * atol, (
                f"step {step}: we chose {ours.token_id} where the reference chose {want} "
                f"by {gap:.3f} nats (more than 2 * {atol})"
            )
            return step
    return len(tokens)


async def stream_outputs(
    engine: AsyncEngine, prompt: str | Sequence[int], params: SamplingParams, delay: float = 0.0
) -> list[RequestOutput]:
    """Every output of one request through ``engine``, after ``delay`` seconds."""
    await asyncio.sleep(delay)
    return [output async for output in engine.generate(engine.request(prompt, params))]


def run_async(llm: LLM, body: Callable[[AsyncEngine], Any]) -> Any:
    """Run ``body(engine)`` on a fresh event loop with an AsyncEngine over ``llm``'s engine."""
    engine = AsyncEngine(llm.engine)

    async def main() -> Any:
        try:
            return await body(engine)
        finally:
            engine.shutdown()

    return asyncio.run(main())


def assert_stream_adds_up(outputs: list[RequestOutput]) -> RequestOutput:
    """The outputs of one streamed request: only the last is finished, and its deltas add up
    to its tokens, text and logprobs. Returns the last."""
    final = outputs[-1]
    assert final.finished and not any(o.finished for o in outputs[:-1])
    completion = final.outputs[0]
    assert [t for o in outputs for t in o.outputs[0].new_token_ids] == completion.token_ids
    assert "".join(o.outputs[0].new_text for o in outputs) == completion.text
    streamed = [lp for o in outputs for lp in o.outputs[0].new_logprobs or []]
    assert streamed == (completion.logprobs or [])
    return final
