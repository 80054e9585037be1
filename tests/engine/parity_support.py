"""The transformers oracle of the engine parity tests, and the AsyncEngine drivers they share.

The reference is transformers' greedy ``generate`` on each prompt alone, on the device the
test runs on (``--device``, or "cuda" in test_cuda_parity). In float32 our tokens must equal
its tokens and our logprobs be within `FLOAT32_ATOL`. In bfloat16 our logprobs are compared
with the float32 reference while the tokens agree, and must be no further from it than
transformers' own bfloat16 run (`assert_bfloat16_as_close_as_transformers`). No fixed bound
fits every model: at its worst step transformers' bfloat16 is itself 0.37 to 0.64 nats from
its float32 on the default model's 30 layers and 0.41 on the tiny "tied" family, 0.05 on the
other tiny ones (measured on the CPU, 12 greedy steps of 5 prompts; ours: 0.30 to 0.35, 0.39
and 0.06). On average ours is 0.85 to 0.95 times as far as transformers'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
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
    experts = getattr(model.config, "_experts_implementation", None)
    if device != "cpu" and experts not in (None, "eager"):
        # Off the CPU transformers runs experts through grouped (and, decoding, batched)
        # matmul kernels made for bfloat16; the eager loop is plain float32 matmuls.
        model.set_experts_implementation("eager")
    if getattr(model.config, "attn_logit_softcapping", None) is not None:
        # Capped scores exist only in the eager attention: SDPA drops the cap (with a warning),
        # and transformers 5.17 picked SDPA for Gemma 2 on a GPU where 5.23 picks eager here.
        model.set_attn_implementation("eager")
    return model


def hf_greedy(
    model: Any, prompt: Sequence[int], num_new_tokens: int
) -> tuple[list[int], torch.Tensor]:
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


def hf_greedy_media(
    model: Any, inputs: dict[str, Any], num_new_tokens: int
) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens of a media model on its processor's ``inputs`` (EOS as
    the model's generation config says), and each token's logprob."""
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=num_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    new = [int(t) for t in out.sequences[0, inputs["input_ids"].shape[1] :]]
    logprobs = [
        float(step[0].float().log_softmax(-1)[t]) for step, t in zip(out.logits, new, strict=True)
    ]
    return new, logprobs


#: Float32 on both sides of a media-family parity test: logprobs agree to rounding.
MEDIA_LOGPROB_TOLERANCE = 1e-4


def busy_media_options(kv_blocks: int) -> dict[str, Any]:
    """A tiny media model's engine options that cut every media run (8-token chunks) and hold
    ``kv_blocks`` KV blocks of 4 tokens (2 KiB each for the tiny models), too few for the
    tests' prompts at once: chunked prefill through media, and preemption."""
    return {
        "dtype": "float32",
        "max_num_batched_tokens": 8,
        "block_size": 4,
        "max_num_seqs": 4,
        "kv_cache_memory": kv_blocks * 2048,
    }


def tokens(output: RequestOutput) -> list[int]:
    """A finished request's tokens."""
    assert output.finished
    return output.outputs[0].token_ids


def logprobs_of(output: RequestOutput) -> list[float]:
    """Each of a request's tokens' logprob."""
    logprobs = output.outputs[0].logprobs
    assert logprobs is not None
    return [entry.logprob for entry in logprobs]


def assert_same(got: list[RequestOutput], want: list[RequestOutput]) -> None:
    """Equal tokens, and logprobs equal to float32 rounding (batches, chunks and caches
    change the order of sums)."""
    assert [tokens(o) for o in got] == [tokens(o) for o in want]
    for a, b in zip(got, want, strict=True):
        assert np.allclose(logprobs_of(a), logprobs_of(b), atol=MEDIA_LOGPROB_TOLERANCE, rtol=0)


def reference_ids(reference: Reference, output: RequestOutput) -> list[int]:
    """The token ids the reference is run on for ``output``."""
    prompt = _reference_prompt(reference, output)
    return reference.encode(prompt) if isinstance(prompt, str) else list(prompt)


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


@dataclass(frozen=True)
class StepLogprobs:
    """One generated token's logprob and its best alternatives': ``values[i]`` of ``ids[i]``,
    the chosen token first."""

    token_id: int
    ids: list[int]
    values: torch.Tensor


def our_steps(output: RequestOutput) -> list[StepLogprobs]:
    """The steps of a finished output that asked for logprobs with top alternatives."""
    (completion,) = output.outputs
    assert completion.logprobs is not None
    return [
        StepLogprobs(
            lp.token_id,
            [lp.token_id, *(t for t, _ in lp.top)],
            torch.tensor([lp.logprob, *(v for _, v in lp.top)]),
        )
        for lp in completion.logprobs
    ]


def oracle_steps(tokens: list[int], logprobs: torch.Tensor, num_top: int) -> list[StepLogprobs]:
    """`StepLogprobs` of an oracle's greedy run (`hf_greedy`), its ``num_top`` best
    alternatives beside each chosen token."""
    steps = []
    for token, row in zip(tokens, logprobs, strict=True):
        ids = [token, *(t for t in row.topk(num_top + 1).indices.tolist() if t != token)]
        steps.append(StepLogprobs(token, ids[: num_top + 1], row[ids[: num_top + 1]]))
    return steps


def bfloat16_deviations(
    tokens: list[int], logprobs: torch.Tensor, steps: list[StepLogprobs], tie: float
) -> list[float]:
    """How far a bfloat16 run's logprobs are from the float32 reference (``tokens`` and
    their per-step ``logprobs``): at each step while the tokens agree, the largest
    ``|value - reference|`` over the step's compared tokens.

    Where the tokens part, that step's deviation is the last: the contexts differ after it.
    The reference must have been a near tie there (its token at most ``tie`` nats above the
    run's; ``2 * atol`` when the run is held within ``atol``: two sides each within ``atol``
    cannot order tokens further apart differently), else rounding cannot explain the parting.
    """
    deviations = []
    for step, (ours, want) in enumerate(zip(steps, tokens, strict=True)):
        row = logprobs[step]
        deviations.append(float((ours.values - row[ours.ids]).abs().max()))
        if ours.token_id != want:
            gap = float(row[want] - row[ours.token_id])
            assert gap <= tie, (
                f"step {step}: {ours.token_id} was chosen where the float32 reference chose "
                f"{want}, {gap:.3f} nats better (a near tie is at most {tie})"
            )
            break
    return deviations


#: `assert_bfloat16_as_close_as_transformers`: how much larger than transformers' bfloat16
#: deviations ours may be, at most and on average (plus `MEAN_SLACK` nats).
MAX_RATIO = 2.0
MEAN_RATIO = 1.5
MEAN_SLACK = 0.01


def assert_bfloat16_as_close_as_transformers(
    reference: Reference, hf_bfloat16: Any, outputs: list[RequestOutput], num_top: int
) -> None:
    """Our bfloat16 greedy ``outputs`` (logprobs with ``num_top`` alternatives asked) are no
    further from the float32 ``reference`` than transformers' bfloat16 model ``hf_bfloat16``
    is on the same prompts (`bfloat16_deviations`, over each run's agreeing steps): at most
    `MAX_RATIO` times its largest deviation (and never held below `BFLOAT16_ATOL`), on
    average `MEAN_RATIO` times its mean; and we part from the reference only at near ties.
    """
    theirs: list[float] = []
    runs = []
    for output in outputs:
        ids = reference_ids(reference, output)
        tokens, logprobs = reference(ids)
        hf_tokens, hf_logprobs = hf_greedy(hf_bfloat16, ids, reference.num_new_tokens)
        hf_steps = oracle_steps(hf_tokens, hf_logprobs, num_top)
        theirs += bfloat16_deviations(tokens, logprobs, hf_steps, tie=float("inf"))
        runs.append((tokens, logprobs, our_steps(output)))
    atol = max(BFLOAT16_ATOL, MAX_RATIO * max(theirs))
    ours = [d for run in runs for d in bfloat16_deviations(*run, tie=2 * atol)]
    summary = (
        f"ours: max {max(ours):.3f}, mean {_mean(ours):.3f} over {len(ours)} steps; "
        f"transformers' bfloat16: max {max(theirs):.3f}, mean {_mean(theirs):.3f}"
    )
    assert max(ours) <= atol, summary
    assert _mean(ours) <= MEAN_RATIO * _mean(theirs) + MEAN_SLACK, summary


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


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


def count_compiled_steps(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows of each step ``llm``'s decode graphs (compiled or captured) run from now on (to
    prove they ran)."""
    compiled = llm.engine.runner.compiled
    assert compiled is not None
    rows: list[int] = []
    run = compiled.run

    def counted(plan: Any) -> torch.Tensor:
        rows.append(len(plan.input_ids))
        return run(plan)

    monkeypatch.setattr(compiled, "run", counted)
    return rows
