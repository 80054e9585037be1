"""The TRT-style `Executor` (docs/api/trt.md#executor, docs/api/trt.md#responses): response tensors
and their shapes, streaming, fake-streamed beams, cancel, the callback form, errors as ``err_msg``,
raw logits equal to transformers' (float32), and p-tuning prompt tables."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers  # the oracle
from trt_helpers import ENGINE_OPTIONS, PROMPT, TIMEOUT, as_array, error, run, tokens

from ferrollm.trt import Executor, InferenceRequest

PROMPT_LONG = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]


@pytest.fixture(scope="module")
def model_dir(tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory("llama3")


@pytest.fixture(scope="module")
def executor(model_dir: Path) -> Iterator[Executor]:
    executor = Executor(model_dir, **ENGINE_OPTIONS)
    yield executor
    executor.shutdown()


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def hf_logits(hf: Any, ids: list[int]) -> np.ndarray:
    with torch.inference_mode():
        return np.asarray(hf(torch.tensor([ids])).logits[0].float().numpy())


def hit_blocks(executor: Executor) -> int:
    return int(executor.engine.stats()["num_prefix_hit_blocks"])


# --- response tensors -----------------------------------------------------------------------


def test_final_response_shapes_and_dtypes(executor: Executor) -> None:
    out = run(executor, n=7)
    assert set(out.tensors) == {"output_ids", "sequence_length"}
    ids, lengths = as_array(out.output_ids), as_array(out.sequence_length)
    assert ids.shape == (1, 7) and ids.dtype == np.int32
    assert lengths.tolist() == [7] and lengths.dtype == np.int32


def test_streaming_sends_one_token_per_response(executor: Executor) -> None:
    want = tokens(executor, n=6)
    request_id = executor.enqueue(
        InferenceRequest(
            PROMPT, 6, streaming=True, return_log_probs=True, return_context_logits=True
        )
    )
    got = list(executor.responses(request_id, TIMEOUT))
    assert [r.is_final for r in got] == [False] * 5 + [True]
    assert [as_array(r.output_ids).tolist() for r in got] == [[[t]] for t in want]
    assert all(as_array(r.sequence_length).tolist() == [1] for r in got)
    assert all(as_array(r.output_log_probs).shape == (1, 1, 1) for r in got)
    assert "context_logits" in got[0].tensors
    assert all("context_logits" not in r.tensors for r in got[1:]), "sent once, first"
    cum = [float(as_array(r.cum_log_probs)[0, 0]) for r in got]
    steps = [float(as_array(r.output_log_probs)[0, 0, 0]) for r in got]
    assert cum == pytest.approx(np.cumsum(steps).tolist(), abs=1e-4)


def test_beam_search_fake_streams_one_final_response(executor: Executor) -> None:
    request_id = executor.enqueue(InferenceRequest(PROMPT, 8, streaming=True, beam_width=3))
    got = list(executor.responses(request_id, TIMEOUT))
    assert len(got) == 1 and got[0].is_final
    assert as_array(got[0].output_ids).shape == (3, 8)
    assert as_array(got[0].sequence_length).tolist() == [8, 8, 8]


def test_ids_are_unique_and_await_responses_collects_any(executor: Executor) -> None:
    ids = [executor.enqueue(InferenceRequest(PROMPT, 3)) for _ in range(4)]
    assert len(set(ids)) == 4
    finals: dict[int, Any] = {}
    while len(finals) < 4:
        for response in executor.await_responses(timeout=TIMEOUT):
            assert response.is_final and response.err_msg == ""
            finals[response.request_id] = response
    assert set(finals) == set(ids)
    assert executor.await_responses(timeout=0.01) == []


def test_explicit_request_ids_must_be_unique_in_flight(executor: Executor) -> None:
    executor.enqueue(InferenceRequest(PROMPT, 200, request_id=2**64 - 1))
    with pytest.raises(ValueError, match="already in flight"):
        executor.enqueue(InferenceRequest(PROMPT, 3, request_id=2**64 - 1))
    assert executor.cancel(2**64 - 1)
    (final,) = list(executor.responses(2**64 - 1, TIMEOUT))
    assert final.is_final
    with pytest.raises(ValueError, match="uint64"):
        executor.enqueue(InferenceRequest(PROMPT, 3, request_id=-1))


def test_cancel_ends_a_stream_with_a_final_response(executor: Executor) -> None:
    request_id = executor.enqueue(InferenceRequest(PROMPT, 200, streaming=True))
    stream = executor.responses(request_id, TIMEOUT)
    assert not next(stream).is_final
    assert executor.cancel(request_id)
    rest = list(stream)
    assert rest[-1].is_final and len(rest) < 199
    assert not executor.cancel(request_id), "no longer in flight"


def test_callback_form_on_a_shared_engine(executor: Executor) -> None:
    calls: list[tuple[int, Mapping[str, Any], bool, str]] = []
    done = threading.Event()

    def callback(request_id: int, tensors: Mapping[str, Any], is_final: bool, err: str) -> None:
        calls.append((request_id, tensors, is_final, err))
        if is_final:
            done.set()

    shared = Executor(executor.engine, send_response_callback=callback)
    assert shared.engine is executor.engine
    request_id = shared.enqueue(InferenceRequest(PROMPT, 4, streaming=True))
    assert done.wait(TIMEOUT)
    assert [c[0] for c in calls] == [request_id] * 4
    assert [c[2] for c in calls] == [False, False, False, True]
    streamed = [int(c[1]["output_ids"][0, 0]) for c in calls]
    assert streamed == tokens(executor, n=4)


def test_torch_tensors_are_accepted(executor: Executor) -> None:
    out = run(
        executor,
        PROMPT,
        5,
        embedding_bias=torch.zeros(1, executor.limits.vocab_size, dtype=torch.bfloat16),
        temperature=torch.tensor([1.0]),
    )
    assert as_array(out.output_ids).tolist() == [tokens(executor, n=5)]
    tensor_prompt = executor.generate(
        InferenceRequest(torch.tensor([PROMPT], dtype=torch.int64), torch.tensor([[5]])), TIMEOUT
    )
    assert as_array(tensor_prompt.output_ids).tolist() == [tokens(executor, n=5)]


# --- failures are err_msg on a final response ------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"draft_input_ids": [1, 2], "beam_width": 2}, ["draft_tokens", "beam"]),
        ({"lora_task_id": 3}, ["lora_task_id", "no LoRA adapters", "enable_lora"]),
        ({"input_ids": [5, 100000]}, ["input_ids[1]"]),
        ({"prompt_embedding_table": [[0.0, 1.0]]}, ["prompt_embedding_table", "hidden_size"]),
        ({"input_ids": list(range(300))}, ["input_ids"]),
    ],
)
def test_bad_requests_end_with_an_error_message(
    executor: Executor, extra: dict[str, Any], words: list[str]
) -> None:
    prompt = extra.pop("input_ids", PROMPT)
    message = error(executor, prompt, **extra)
    for word in words:
        assert word in message


def test_draft_input_ids_keep_the_greedy_output_and_a_correct_draft_is_accepted(
    executor: Executor,
) -> None:
    plain = tokens(executor, n=12)
    accepted = int(executor.engine.stats()["num_accepted_draft_tokens"])
    assert tokens(executor, n=12, draft_input_ids=plain[:8]) == plain
    assert int(executor.engine.stats()["num_accepted_draft_tokens"]) - accepted == 8
    for draft in ([7] * 6, [*plain[:3], 1, 1]):
        assert tokens(executor, n=12, draft_input_ids=draft) == plain


# --- guided decoding (the TRT backend's string tensors) ---------------------------------------

GUIDE_SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["n", "ok"],
    "additionalProperties": False,
}


def guided_text(executor: Executor, seed: int, kind: str, guide: str | None) -> str | None:
    """The sampled output's text, or None when it ran into its length (60 tokens). A guided
    output ends where its guide completes (or on an allowed end_id)."""
    eos = 2  # the tiny tokenizer's <|im_end|>
    out = run(
        executor,
        PROMPT,
        60,
        runtime_top_p=1.0,
        random_seed=seed,
        end_id=eos,
        guided_decoding_guide_type=kind,
        guided_decoding_guide=guide,
    )
    ids = as_array(out.output_ids)[0, : as_array(out.sequence_length)[0]].tolist()
    if ids and ids[-1] == eos:
        ids = ids[:-1]
    elif len(ids) >= 60:
        return None
    return str(executor.engine.tokenizer.decode(ids))


def test_guided_decoding_holds_sampled_output_to_the_guide(executor: Executor) -> None:
    import json

    import jsonschema

    finished = 0
    for seed in range(4):
        text = guided_text(executor, seed, "json_schema", json.dumps(GUIDE_SCHEMA))
        if text is not None:
            jsonschema.validate(json.loads(text), GUIDE_SCHEMA)
            finished += 1
        text = guided_text(executor, seed, "regex", "[0-9]{3}-[a-z]{2}")
        assert text is not None and len(text) == 6 and text[3] == "-" and text[:3].isdigit()
        text = guided_text(executor, seed, "json", None)
        if text is not None:
            assert isinstance(json.loads(text), dict)
    assert finished >= 2


@pytest.mark.parametrize(
    ("guide", "words"),
    [
        ({"guided_decoding_guide_type": "ebnf_grammar", "guided_decoding_guide": "root ::= \"a\""},
         ["guided_decoding_guide_type", "lark"]),
        ({"guided_decoding_guide_type": "json_schema"}, ["guided_decoding_guide", "JSON schema"]),
        ({"guided_decoding_guide": "[0-9]+"},
         ["guided_decoding_guide", "guided_decoding_guide_type"]),
        ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "((a{100}){100}){100}",
          "end_id": 2}, ["guided_decoding_guide_type", "unrolls"]),
        ({"guided_decoding_guide_type": "json"}, ["end_id"]),
    ],
)  # fmt: skip
def test_bad_guides_end_with_an_error_naming_the_tensor(
    executor: Executor, guide: dict[str, Any], words: list[str]
) -> None:
    message = error(executor, PROMPT, **guide)
    for word in words:
        assert word in message, message


# --- logits equal transformers' -------------------------------------------------------------


def test_context_and_generation_logits_equal_transformers(executor: Executor, hf: Any) -> None:
    run(executor, PROMPT_LONG, 1)  # caches the prompt's blocks: the next request skips them
    before = hit_blocks(executor)
    out = run(
        executor,
        PROMPT_LONG,
        6,
        return_context_logits=True,
        return_generation_logits=True,
        return_log_probs=True,
    )
    assert hit_blocks(executor) == before, "context logits skip the prefix cache"
    generated = as_array(out.output_ids)[0].tolist()
    ref = hf_logits(hf, PROMPT_LONG + generated)
    vocab = ref.shape[1]
    context = as_array(out.context_logits)
    assert context.shape == (1, len(PROMPT_LONG), vocab) and context.dtype == np.float32
    np.testing.assert_allclose(context[0], ref[: len(PROMPT_LONG)], atol=1e-3)
    generation = as_array(out.generation_logits)
    assert generation.shape == (1, 1, 6, vocab)
    np.testing.assert_allclose(generation[0, 0], ref[len(PROMPT_LONG) - 1 : -1], atol=1e-3)
    logprobs = torch.from_numpy(generation[0, 0]).log_softmax(-1)
    chosen = logprobs[torch.arange(6), torch.tensor(generated)].numpy()
    np.testing.assert_allclose(as_array(out.output_log_probs)[0, 0], chosen, atol=1e-4)


def test_beam_generation_logits_equal_transformers(executor: Executor, hf: Any) -> None:
    out = run(executor, PROMPT_LONG, 5, beam_width=3, end_id=2, return_generation_logits=True)
    ids, lengths = as_array(out.output_ids), as_array(out.sequence_length)
    generation = as_array(out.generation_logits)
    assert generation.shape[:3] == (1, 3, ids.shape[1]) and generation.dtype == np.float32
    for b in range(3):
        beam = ids[b, : lengths[b]].tolist()
        ref = hf_logits(hf, PROMPT_LONG + beam)
        np.testing.assert_allclose(
            generation[0, b, : len(beam)], ref[len(PROMPT_LONG) - 1 : -1], atol=1e-3
        )
        assert not generation[0, b, len(beam) :].any()  # padded past the beam's end
        # The first step expands the best 3 tokens of the prompt's last row: every beam starts
        # with one of them.
        assert beam[0] in np.argsort(generation[0, b, 0])[-3:]


def test_logits_under_chunked_prefill(model_dir: Path, hf: Any) -> None:
    chunked = Executor(model_dir, **{**ENGINE_OPTIONS, "max_num_batched_tokens": 6})
    try:
        out = run(chunked, PROMPT_LONG, 3, return_context_logits=True)
        ref = hf_logits(hf, PROMPT_LONG)
        np.testing.assert_allclose(as_array(out.context_logits)[0], ref, atol=1e-3)
        assert "generation_logits" not in out.tensors
    finally:
        chunked.shutdown()


# --- p-tuning --------------------------------------------------------------------------------


def test_a_table_row_equal_to_an_embedding_row_acts_as_that_token(
    executor: Executor, hf: Any
) -> None:
    vocab = executor.limits.vocab_size
    embedding = hf.get_input_embeddings().weight.detach().float().numpy()
    table = embedding[[PROMPT[0], PROMPT[2], 11]]  # rows 0, 1, 2
    virtual = [vocab + 0, PROMPT[1], vocab + 1, *PROMPT[3:]]
    want = tokens(executor, PROMPT, 12)
    assert tokens(executor, virtual, 12, prompt_embedding_table=table) == want
    # Another row changes the output; the table's rows are what the virtual ids read.
    other = table.copy()
    other[0] = embedding[77]
    assert tokens(executor, virtual, 12, prompt_embedding_table=other) == tokens(
        executor, [77, *PROMPT[1:]], 12
    )
    assert tokens(executor, virtual, 12, prompt_embedding_table=torch.from_numpy(table)) == want


def test_prompt_tables_salt_the_prefix_cache(executor: Executor) -> None:
    vocab = executor.limits.vocab_size
    prompt = [vocab, *PROMPT_LONG]
    hidden = executor.engine.model_config.hidden_size
    table = np.random.default_rng(0).standard_normal((2, hidden)).astype(np.float32) * 0.02
    run(executor, PROMPT_LONG, 1)
    before = hit_blocks(executor)
    run(executor, PROMPT_LONG, 1, prompt_embedding_table=table)
    assert hit_blocks(executor) == before, "no block shared with a request without the table"
    run(executor, prompt, 1, prompt_embedding_table=table)
    run(executor, prompt, 1, prompt_embedding_table=table)
    assert hit_blocks(executor) > before, "requests of one table share blocks"
    changed = table.copy()
    changed[1] += 1.0
    hits = hit_blocks(executor)
    run(executor, prompt, 1, prompt_embedding_table=changed)
    assert hit_blocks(executor) == hits, "another table shares nothing"


def test_generation_logits_alone_are_the_rows_greedy_chose_from(executor: Executor) -> None:
    out = run(executor, n=5, return_generation_logits=True)
    assert set(out.tensors) == {"output_ids", "sequence_length", "generation_logits"}
    logits = as_array(out.generation_logits)
    assert logits.shape == (1, 1, 5, executor.limits.vocab_size)
    assert logits[0, 0].argmax(-1).tolist() == as_array(out.output_ids)[0].tolist()


def test_a_failed_step_is_an_error_message_and_the_engine_goes_on(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = executor.engine.engine.runner
    real_run = runner.run
    calls = iter(range(1000))

    def failing_run(plan: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if next(calls) == 0:
            raise RuntimeError("device fell over")
        return real_run(plan, *args, **kwargs)

    monkeypatch.setattr(runner, "run", failing_run)
    message = error(executor, n=4)
    assert "device fell over" in message
    assert tokens(executor, n=4) == tokens(executor, n=4), "later requests run"


def test_an_executor_whose_engine_is_gone_answers_with_errors(model_dir: Path) -> None:
    gone = Executor(model_dir, **ENGINE_OPTIONS)
    gone.shutdown()
    assert "shut down" in error(gone)
    assert not gone.cancel(1) and gone.num_in_flight == 0
