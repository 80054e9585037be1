"""`InferenceRequest` (docs/api/trt.md): tensor-likes in, documented shapes and dtypes out,
and every check made by the one Rust validation path, naming the tensor (no torch here)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ferrollm import Limits, ValidationError
from ferrollm.trt import InferenceRequest

BASE: dict[str, Any] = {"input_ids": [1, 2, 3], "request_output_len": 8}
LIMITS = Limits(vocab_size=100, max_beam_width=4)


def tensors(**extra: Any) -> dict[str, np.ndarray]:
    return InferenceRequest(**{**BASE, **extra}).to_tensor_map(LIMITS)


@pytest.mark.parametrize(
    ("given", "want"),
    [
        (8, [[8]]),
        ([8], [[8]]),
        ([[8]], [[8]]),
        (np.array([[8]], dtype=np.int64), [[8]]),
        (np.int16(8), [[8]]),
    ],
)
def test_request_output_len_is_brought_to_1_by_1(given: Any, want: Any) -> None:
    out = tensors(request_output_len=given)["request_output_len"]
    assert out.dtype == np.int32 and out.tolist() == want


@pytest.mark.parametrize("given", [[1, 2, 3], [[1, 2, 3]], np.array([1, 2, 3], dtype=np.uint8)])
def test_input_ids_are_one_int32_row(given: Any) -> None:
    out = tensors(input_ids=given)["input_ids"]
    assert out.dtype == np.int32 and out.shape == (1, 3) and out.tolist() == [[1, 2, 3]]


@pytest.mark.parametrize(
    ("name", "given", "dtype", "value"),
    [
        ("streaming", True, np.bool_, True),
        ("streaming", [True], np.bool_, True),
        ("beam_width", [[2]], np.int32, 2),
        ("temperature", 0.5, np.float32, 0.5),
        ("runtime_top_k", np.array([3]), np.int32, 3),
        ("runtime_top_p", [0.25], np.float32, 0.25),
        ("random_seed", 2**64 - 1, np.uint64, 2**64 - 1),
        ("end_id", -1, np.int32, -1),
        ("return_log_probs", np.bool_(True), np.bool_, True),
    ],
)
def test_scalars_become_one_value_vectors(name: str, given: Any, dtype: Any, value: Any) -> None:
    out = tensors(**{name: given})[name]
    assert out.shape == (1,) and out.dtype == dtype and out[0] == value


def test_pybind_aliases_and_round_trip() -> None:
    request = InferenceRequest(
        [4, 5], max_new_tokens=3, length_penalty=0.0, is_streaming=False, request_id=7
    )
    assert request.request_output_len == 3 and request.len_penalty == 0.0
    assert request.streaming is False
    tmap = request.to_tensor_map(LIMITS)
    again = InferenceRequest.from_tensor_map(tmap, request_id=7)
    assert again.request_id == 7
    for name, value in again.to_tensor_map(LIMITS).items():
        assert value.dtype == tmap[name].dtype and np.array_equal(value, tmap[name]), name
    with pytest.raises(TypeError, match="alias of `request_output_len`"):
        InferenceRequest([1], 3, max_new_tokens=3)
    with pytest.raises(TypeError, match="no tensor named 'top_k'"):
        InferenceRequest([1], 3, top_k=3)


def test_absent_tensors_are_dropped() -> None:
    assert set(tensors()) == {"input_ids", "request_output_len"}


# --- docs/api/trt.md#word-lists: the word-list format ---------------------------------------------


def word_list_params(value: Any) -> list[list[int]]:
    request = InferenceRequest(**BASE, bad_words_list=value)
    return request.validate(LIMITS).params.bad_words


def test_word_list_example_from_the_spec() -> None:
    # [[77, 15249], [77]] -> [[77, 15249, 77], [2, 3, -1]] (with ids inside this vocabulary)
    assert word_list_params([[77, 49, 77], [2, 3, -1]]) == [[77, 49], [77]]
    assert word_list_params(np.array([[77, 49, 77], [2, 3, -1]])) == [[77, 49], [77]]


def test_word_list_padding_and_batched_form() -> None:
    # Row 0 padded with 0, row 1 with -1.
    assert word_list_params([[5, 0, 0], [1, -1, -1]]) == [[5]]
    batched = np.array([[[5, 6, 0], [2, -1, -1]], [[7, 0, 0], [1, -1, -1]]])
    assert word_list_params(batched) == [[5, 6], [7]]
    out = tensors(bad_words_list=batched)["bad_words_list"]
    assert out.shape == (2, 2, 3) and out.dtype == np.int32


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ([[5, 6]], "two rows"),
        ([[5, 6, 7], [1, 2]], "same length"),
        ([[5, 6, 7], [2, 2, -1]], "bad end offset"),  # not strictly increasing
        ([[5, 6, 7], [2, 4, -1]], "bad end offset"),  # past row 0
        ([[5, 6, 7], [-1, 2, 3]], "bad end offset"),  # -1 before the end
        ([[5, 6, 7], [0, 3, -1]], "bad end offset"),  # an empty word
    ],
)
def test_word_list_errors_name_the_tensor(value: Any, rule: str) -> None:
    with pytest.raises(ValidationError, match=rule) as info:
        word_list_params(value)
    assert info.value.param == "bad_words_list"


# --- errors name the tensor ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"input_ids": [1, 100]}, "input_ids[1]", "out_of_range"),
        ({"input_ids": []}, "input_ids", "empty"),
        ({"request_output_len": 0}, "request_output_len", "out_of_range"),
        ({"request_output_len": 2**31}, "request_output_len", "out_of_range"),
        ({"random_seed": -1}, "random_seed", "out_of_range"),
        ({"beam_width": 5}, "beam_width", "out_of_range"),
        ({"runtime_top_k": 1025}, "runtime_top_k", "out_of_range"),
        ({"end_id": 100}, "end_id", "out_of_range"),
        ({"embedding_bias": [0.0] * 99}, "embedding_bias", "invalid_format"),
        (
            {"draft_input_ids": [1], "draft_logits": [[0.0] * 99]},
            "draft_logits[0]",
            "invalid_format",
        ),
        ({"lora_config": [[0, 1, 8]]}, "lora_config", "conflict"),
        ({"lora_weights": [[0.5]], "lora_config": [[0, 1, 8]]}, "lora_weights", "conflict"),
        ({"prompt_vocab_size": 2}, "prompt_vocab_size", "conflict"),
        ({"streaming": [True, False]}, "streaming", "invalid_format"),
    ],
)
def test_bad_tensors_are_refused_by_name(extra: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(ValidationError) as info:
        tensors(**extra)
    assert (info.value.param, info.value.code) == (param, code)


def test_prompt_table_admits_virtual_ids_and_keeps_float16() -> None:
    table = np.ones((3, 4), dtype=np.float16)
    out = tensors(input_ids=[100, 102, 7], prompt_embedding_table=table)
    assert out["prompt_embedding_table"].dtype == np.float16
    assert out["prompt_embedding_table"].shape == (3, 4)
    assert tensors(prompt_embedding_table=table.tolist())["prompt_embedding_table"].dtype == (
        np.float32
    )
    with pytest.raises(ValidationError) as info:
        tensors(input_ids=[103], prompt_embedding_table=table)
    assert info.value.param == "input_ids[0]"


@pytest.mark.parametrize(
    "guide", ['{"type": "object"}', ['{"type": "object"}'], np.array([b'{"type": "object"}'])]
)
def test_guided_decoding_tensors_are_one_string_each(guide: Any) -> None:
    request = InferenceRequest(
        [1, 2], 4, end_id=0, guided_decoding_guide_type="json_schema", guided_decoding_guide=guide
    )
    valid, tensors = request.checked()
    assert valid.grammar == ("json_schema", '{"type":"object"}', "guided_decoding_guide_type")
    assert tensors["guided_decoding_guide"].tolist() == ['{"type": "object"}']
    again = InferenceRequest.from_tensor_map(tensors)
    assert again.checked()[0].grammar == valid.grammar
    with pytest.raises(ValidationError) as info:
        InferenceRequest([1, 2], 4, guided_decoding_guide_type=["json", "regex"]).validate()
    assert info.value.param == "guided_decoding_guide_type"
    with pytest.raises(ValidationError) as info:
        InferenceRequest([1, 2], 4, guided_decoding_guide_type="yaml").validate()
    assert (info.value.param, info.value.code) == ("guided_decoding_guide_type", "invalid_value")
    with pytest.raises(ValidationError) as info:  # a guided output must be able to end
        InferenceRequest([1, 2], 4, guided_decoding_guide_type="json").validate()
    assert (info.value.param, info.value.code) == ("end_id", "missing")
