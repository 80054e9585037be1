"""Beam search against transformers' ``generate(num_beams=...)`` on the same float32 weights.

The default model (its GGUF dequantized by both sides) and tiny random models of each family.
Every case compares the returned hypotheses token for token, in order, and their scores
(``sequences_scores``) within 1e-4: widths 1 to 8, ``n`` below the width, length penalties
0.5/1/2, the three ``early_stopping`` values, hypotheses ended early by EOS, and the same
searches batched with sampled requests, under chunked prefill and under preemption.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers  # the oracle; pinned in requirements/dev.txt, so never skipped

from ferrollm import LLM, SamplingParams
from ferrollm.engine import RequestOutput

PROMPT = "The capital of France is"
#: A chat prompt whose answer is short: hypotheses end by EOS (<|im_end|>) well before the limit.
QUESTION = [{"role": "user", "content": "What is 2 + 2? Answer with one number."}]


@dataclass(frozen=True)
class Case:
    width: int
    n: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    max_tokens: int = 10

    def params(self, **extra: Any) -> SamplingParams:
        return SamplingParams(
            use_beam_search=True,
            best_of=self.width,
            n=self.n,
            max_tokens=self.max_tokens,
            length_penalty=self.length_penalty,
            early_stopping=self.early_stopping,
            **extra,
        )


def hf_beams(
    hf: Any, prompt: list[int], case: Case, eos: tuple[int, ...], **hf_extra: Any
) -> tuple[list[list[int]], list[float]]:
    """transformers' hypotheses (generated tokens, padding cut) and their scores."""
    out = hf.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        num_beams=case.width,
        num_return_sequences=case.n,
        max_new_tokens=case.max_tokens,
        length_penalty=case.length_penalty,
        early_stopping=case.early_stopping,
        eos_token_id=list(eos),
        pad_token_id=eos[0],
        return_dict_in_generate=True,
        output_scores=True,
        **hf_extra,
    )
    if case.width == 1:
        # transformers runs width 1 as greedy decoding, which reports no beam score: the score
        # is then the chosen tokens' summed logprobs over length ** length_penalty.
        tokens = out.sequences[0, len(prompt) :].tolist()
        logprobs = torch.cat(out.scores).float().log_softmax(-1)
        total = logprobs.gather(1, torch.tensor(tokens)[:, None]).sum().item()
        return [tokens], [total / len(tokens) ** case.length_penalty]
    lengths = (out.beam_indices >= 0).sum(dim=1).tolist()
    tokens = [
        seq[len(prompt) : len(prompt) + length].tolist()
        for seq, length in zip(out.sequences, lengths, strict=True)
    ]
    return tokens, out.sequences_scores.tolist()


def assert_same_beams(
    output: RequestOutput, expected: tuple[list[list[int]], list[float]], label: str
) -> None:
    tokens, scores = expected
    assert [c.index for c in output.outputs] == list(range(len(tokens))), label
    assert [c.token_ids for c in output.outputs] == tokens, label
    ours = [c.score for c in output.outputs]
    assert all(s is not None for s in ours), label
    torch.testing.assert_close(
        torch.tensor(ours, dtype=torch.float64),
        torch.tensor(scores, dtype=torch.float64),
        atol=1e-4,
        rtol=0,
        msg=label,
    )


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(
        dtype="float32",
        quantization="none",
        kv_cache_memory="64MiB",
        max_num_batched_tokens=256,
        max_num_seqs=16,
    )


@pytest.fixture(scope="module")
def hf_default(smollm2_gguf: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32
    ).eval()


CASES = [
    Case(1, 1),
    Case(2, 2),
    Case(4, 2),
    Case(8, 3, max_tokens=8),
    Case(4, 4, length_penalty=0.5, early_stopping="never"),
    Case(4, 1, length_penalty=2.0, early_stopping=True),
    Case(3, 2, length_penalty=1.0, early_stopping="never"),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_beams_equal_transformers_on_the_default_model(
    llm: LLM, hf_default: Any, case: Case
) -> None:
    eos = llm.engine.model_config.eos_token_ids
    prompt = llm.get_tokenizer().encode(PROMPT)
    (output,) = llm.generate([prompt], case.params())
    assert_same_beams(output, hf_beams(hf_default, prompt, case, eos), str(case))
    assert all(c.finish_reason == "length" for c in output.outputs)


@pytest.mark.parametrize(
    "case",
    [
        Case(4, 3, max_tokens=16),
        Case(4, 2, early_stopping=True, max_tokens=16),
        Case(2, 2, length_penalty=0.5, early_stopping="never", max_tokens=16),
    ],
    ids=str,
)
def test_hypotheses_ended_by_eos_equal_transformers(llm: LLM, hf_default: Any, case: Case) -> None:
    tokenizer = llm.get_tokenizer()
    text = tokenizer.apply_chat_template(QUESTION, None, True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    eos = llm.engine.model_config.eos_token_ids
    expected = hf_beams(hf_default, prompt, case, eos)
    (output,) = llm.generate([prompt], case.params())
    assert_same_beams(output, expected, str(case))
    ended = [c for c in output.outputs if c.finish_reason == "stop"]
    assert ended, "the answer is short: some hypothesis ends by EOS"
    for c in ended:
        assert c.token_ids[-1] in eos and len(c.token_ids) < case.max_tokens
        assert c.stop_reason is None  # EOS, vLLM's convention
        assert "<|im_end|>" not in c.text  # the EOS token's text is dropped
    assert "4" in output.outputs[0].text


def test_logits_processors_act_per_beam_as_in_transformers(llm: LLM, hf_default: Any) -> None:
    """Repetition penalty, no-repeat n-grams, a bad word and min_tokens on each beam's
    logprobs, as transformers' processors do in beam search."""
    tokenizer = llm.get_tokenizer()
    text = tokenizer.apply_chat_template(QUESTION, None, True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    eos = llm.engine.model_config.eos_token_ids
    case = Case(4, 2, max_tokens=12)
    plain = hf_beams(hf_default, prompt, case, eos)
    banned = plain[0][0][0]  # the best hypothesis's first token
    expected = hf_beams(
        hf_default,
        prompt,
        case,
        eos,
        repetition_penalty=1.3,
        no_repeat_ngram_size=2,
        bad_words_ids=[[banned]],
        min_new_tokens=6,
    )
    params = case.params(
        repetition_penalty=1.3, no_repeat_ngram_size=2, bad_words=[[banned]], min_tokens=6
    )
    (output,) = llm.generate([prompt], params)
    assert_same_beams(output, expected, "processors")
    assert expected[0] != plain[0], "the processors change the search"
    for c in output.outputs:
        assert banned not in c.token_ids and len(c.token_ids) >= 6


def test_beam_text_and_logprobs_describe_the_hypothesis(llm: LLM) -> None:
    case = Case(4, 2)
    tokenizer = llm.get_tokenizer()
    (output,) = llm.generate([PROMPT], case.params(logprobs=3))
    for c in output.outputs:
        assert c.text == tokenizer.decode(c.token_ids)
        assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
        assert [lp.token_id for lp in c.logprobs] == c.token_ids
        for lp in c.logprobs:
            assert len(lp.top) == 3 and lp.top[0][1] >= lp.logprob
        # The score is the sum of the tokens' logprobs over length ** length_penalty.
        assert c.cumulative_logprob is not None and c.score is not None
        assert c.score == pytest.approx(c.cumulative_logprob / len(c.token_ids), abs=1e-4)


def test_beams_are_unchanged_when_batched_chunked_and_preempted(hf_default: Any, llm: LLM) -> None:
    """Two beam groups and sampled requests at once, on an engine whose 8-token step budget
    chunks every prompt and whose 20-block cache forces preemptions."""
    eos = llm.engine.model_config.eos_token_ids
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.encode(PROMPT), tokenizer.encode("def fibonacci(n):")]
    cases = [Case(4, 2, max_tokens=10), Case(3, 3, length_penalty=0.5, max_tokens=10)]
    expected = [hf_beams(hf_default, p, c, eos) for p, c in zip(prompts, cases, strict=True)]
    tight = _small_cache_llm(llm, 20, max_num_batched_tokens=8, max_num_seqs=12)
    sampled = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=12, ignore_eos=True)
    outputs = tight.generate(
        [prompts[0], "Once upon a time", prompts[1], "Hello"],
        [cases[0].params(), sampled, cases[1].params(), sampled],
    )
    stats = tight.engine.scheduler.stats()
    assert stats["num_preemptions"] > 0, f"the cache is tight enough: {stats}"
    for i, exp in ((0, expected[0]), (2, expected[1])):
        assert_same_beams(outputs[i], exp, f"prompt {i}")
    assert tight.engine.scheduler.stats()["num_used_blocks"] == 0


def _small_cache_llm(llm: LLM, num_blocks: int, **options: Any) -> LLM:
    """The default model in the parity mode with a cache of ``num_blocks`` 4-token blocks
    (float32) and 32-token sequences."""
    c = llm.engine.model_config
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4
    return LLM(
        dtype="float32",
        quantization="none",
        kv_cache_memory=num_blocks * 4 * per_token,
        block_size=4,
        max_model_len=32,
        **options,
    )


def test_beams_equal_transformers_on_tiny_models(tiny_model_dir: Path, tiny_family: str) -> None:
    path, family = tiny_model_dir, tiny_family
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(path, dtype="float32", kv_cache_memory="4MiB", max_model_len=64, max_num_seqs=8)
    eos = llm.engine.model_config.eos_token_ids
    prompt = llm.get_tokenizer().encode("Hello world! hello, world")
    for case in (Case(4, 2, max_tokens=8), Case(2, 1, length_penalty=0.5, early_stopping=True)):
        (output,) = llm.generate([prompt], case.params())
        assert_same_beams(output, hf_beams(hf, prompt, case, eos), f"{family} {case}")


def test_a_beam_wider_than_allowed_or_than_the_cache_is_refused(llm: LLM) -> None:
    too_wide = SamplingParams(use_beam_search=True, best_of=9, n=1, max_tokens=4)
    with pytest.raises(ValueError, match="max_beam_width") as info:
        llm.generate([PROMPT], too_wide)
    assert getattr(info.value, "param", None) == "best_of"
    tiny = _small_cache_llm(llm, 9, max_num_batched_tokens=32)
    huge = SamplingParams(use_beam_search=True, best_of=8, n=1, max_tokens=20)
    with pytest.raises(ValueError, match="KV blocks") as info:
        tiny.generate([PROMPT], huge)
    assert getattr(info.value, "param", None) == "best_of"


def test_a_beam_search_cut_by_its_deadline_returns_its_best_hypotheses(llm: LLM) -> None:
    params = SamplingParams(
        use_beam_search=True, best_of=4, n=2, max_tokens=300, ignore_eos=True, timeout_s=0.5
    )
    (output,) = llm.generate([PROMPT], params)
    assert [c.index for c in output.outputs] == [0, 1]
    assert all(c.finish_reason == "timeout" for c in output.outputs)
    assert all(0 < len(c.token_ids) < 300 for c in output.outputs)
    scores = [c.score for c in output.outputs]
    assert None not in scores and scores == sorted(scores, reverse=True)
    assert llm.engine.scheduler.stats()["num_used_blocks"] == 0
