"""MindIE ``/v2/models/{model}/generate[_stream]`` over raw HTTP (docs/api/mindie.md),
fullTextEnabled off.

Bodies and SSE framing are checked byte for byte where the spec fixes them: ``data: `` events of
one JSON line, no ``[DONE]``, ``finish_reason`` inside ``details`` on the last frame only,
timing fields, the ``id`` echoed in every frame.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest

from .e2e_support import (
    MODEL,
    PROMPT,
    PROMPT_TOKENS,
    QUESTION,
    QUESTION_TOKENS,
    Oracle,
    Server,
    sse_payloads,
)

FRAME_KEYS = {"id", "model_name", "model_version", "text_output", "prefill_time", "decode_time"}
DETAILS_KEYS = {
    "generated_tokens",
    "first_token_cost",
    "decode_cost",
    "batch_size",
    "queue_wait_time",
}


def generate_body(text: str, max_new_tokens: int, **fields: Any) -> dict[str, Any]:
    parameters = {"do_sample": False, "max_new_tokens": max_new_tokens}
    parameters.update(fields.pop("parameters", {}))
    return {"text_input": text, "parameters": parameters, **fields}


def stream_frames(server: Server, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = server.http.post(f"/v2/models/{MODEL}/generate_stream", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response.content)
    # generate_stream has no sentinel (docs/decisions.md#the-end-of-stream-sentinel)
    assert "[DONE]" not in payloads
    return [json.loads(p) for p in payloads]


def check_frames(frames: list[dict[str, Any]], *, details: bool) -> None:
    """The shape every generate_stream response has, whatever its text."""
    assert frames
    for i, frame in enumerate(frames):
        last = i == len(frames) - 1
        expected_keys = FRAME_KEYS | ({"details"} if details or last else set())
        assert set(frame) == expected_keys, frame
        assert frame["model_name"] == MODEL and frame["model_version"] is None
        # prefill_time only in the first frame, decode_time in every later one (ms).
        if i == 0:
            assert isinstance(frame["prefill_time"], float) and frame["prefill_time"] > 0
            assert frame["decode_time"] is None
        else:
            assert frame["prefill_time"] is None
            assert isinstance(frame["decode_time"], float) and frame["decode_time"] > 0
        if "details" in frame:
            d = frame["details"]
            assert set(d) == DETAILS_KEYS | ({"finish_reason"} if last else set()), d
            assert d["first_token_cost"] is None and d["decode_cost"] is None
            assert isinstance(d["batch_size"], int) and d["batch_size"] >= 1
            assert isinstance(d["queue_wait_time"], int) and d["queue_wait_time"] >= 0
    assert len({f["id"] for f in frames}) == 1


def test_generate_equals_the_offline_engine(server: Server, oracle: Oracle) -> None:
    expected = oracle.complete(PROMPT, PROMPT_TOKENS)
    body = generate_body(PROMPT, PROMPT_TOKENS, id="e2e-generate-1", parameters={"details": True})
    response = server.http.post(f"/v2/models/{MODEL}/generate", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    out = response.json()
    assert set(out) == {
        "id",
        "model_name",
        "model_version",
        "text_output",
        "details",
        "prefill_time",
        "decode_time_arr",
    }
    assert out["id"] == "e2e-generate-1"
    assert out["model_name"] == MODEL and out["model_version"] is None
    assert out["text_output"] == expected.text
    details = out["details"]
    assert set(details) == DETAILS_KEYS | {"finish_reason"}
    assert details["finish_reason"] == "length"
    assert details["generated_tokens"] == PROMPT_TOKENS == len(expected.token_ids)
    assert details["first_token_cost"] is None and details["decode_cost"] is None
    assert details["batch_size"] == 1 and details["queue_wait_time"] >= 0
    assert isinstance(out["prefill_time"], float) and out["prefill_time"] > 0
    assert len(out["decode_time_arr"]) == PROMPT_TOKENS - 1 and all(
        t > 0 for t in out["decode_time_arr"]
    )


def test_generate_without_id_gets_endpoint_common(server: Server) -> None:
    ids = []
    for _ in range(2):
        response = server.http.post(f"/v2/models/{MODEL}/generate", json=generate_body("Hi", 1))
        assert response.status_code == 200, response.text
        ids.append(response.json()["id"])
        # details: false still reports how the request ended
        # (docs/decisions.md#details-when-not-asked-for).
        assert set(response.json()["details"]) >= {"finish_reason", "generated_tokens"}
    assert all(re.fullmatch(r"endpoint_common_\d+", i) for i in ids)
    assert ids[0] != ids[1]


def test_generate_stream_framing_and_details(server: Server, oracle: Oracle) -> None:
    expected = oracle.complete(PROMPT, PROMPT_TOKENS)
    body = generate_body(PROMPT, PROMPT_TOKENS, id="e2e-stream-1", parameters={"details": True})
    frames = stream_frames(server, body)
    check_frames(frames, details=True)
    assert {f["id"] for f in frames} == {"e2e-stream-1"}
    # One frame per generated token here (ASCII text): generated_tokens counts 1, 2, ...
    assert [f["details"]["generated_tokens"] for f in frames] == list(range(1, PROMPT_TOKENS + 1))
    assert frames[-1]["details"]["finish_reason"] == "length"
    assert "".join(f["text_output"] for f in frames) == expected.text  # deltas, not cumulative


def test_generate_stream_without_details(server: Server, oracle: Oracle) -> None:
    expected = oracle.complete(PROMPT, PROMPT_TOKENS)
    frames = stream_frames(server, generate_body(PROMPT, PROMPT_TOKENS))
    check_frames(frames, details=False)
    assert re.fullmatch(r"endpoint_common_\d+", frames[0]["id"])
    assert frames[-1]["details"]["finish_reason"] == "length"
    assert frames[-1]["details"]["generated_tokens"] == PROMPT_TOKENS
    assert "".join(f["text_output"] for f in frames) == expected.text


def test_generate_stream_ends_with_eos_token(server: Server, oracle: Oracle) -> None:
    # A chat-templated prompt: the model answers and ends with its EOS (<|im_end|>).
    text = oracle.tokenizer.apply_chat_template(QUESTION)
    expected = oracle.complete(text, QUESTION_TOKENS)
    assert expected.finish_reason == "stop" and expected.stop_reason is None  # EOS
    frames = stream_frames(server, generate_body(text, QUESTION_TOKENS, id="e2e-eos"))
    check_frames(frames, details=False)
    final = frames[-1]
    assert final["details"]["finish_reason"] == "eos_token"
    assert final["details"]["generated_tokens"] == len(expected.token_ids)  # EOS counted
    # the EOS text is not emitted (docs/decisions.md#eos-text-in-the-last-frame)
    assert final["text_output"] == ""
    joined = "".join(f["text_output"] for f in frames)
    assert joined == expected.text and "<|im_end|>" not in joined
    whole = server.http.post(
        f"/v2/models/{MODEL}/generate", json=generate_body(text, QUESTION_TOKENS)
    )
    assert whole.json()["text_output"] == expected.text
    assert whole.json()["details"]["finish_reason"] == "eos_token"


def test_duplicate_id_in_flight_is_409(server: Server) -> None:
    body = generate_body(PROMPT, 200, id="e2e-dup")
    with server.http.stream("POST", f"/v2/models/{MODEL}/generate_stream", json=body) as first:
        assert first.status_code == 200
        # Keep the line iterator alive: closing it (even by garbage collection) closes the
        # connection, which is a disconnect.
        lines = first.iter_lines()
        assert next(lines).startswith("data: ")  # the first frame: the request is running
        with httpx.Client(base_url=server.url, timeout=30) as other:
            dup = other.post(
                f"/v2/models/{MODEL}/generate", json=generate_body("Hi", 1, id="e2e-dup")
            )
        assert dup.status_code == 409, dup.text
        assert set(dup.json()) == {"error", "error_type"} and "e2e-dup" in dup.json()["error"]
        assert next(lines) == ""  # the first request is still being served
    # Once the server has seen the client leave (409 until then), the id is free again at
    # once, even while the engine is still dropping the aborted request.
    deadline = time.monotonic() + 5.0
    while True:
        again = server.http.post(
            f"/v2/models/{MODEL}/generate", json=generate_body("Hi", 1, id="e2e-dup")
        )
        if again.status_code != 409 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert again.status_code == 200, again.text


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        (f"/v2/models/{MODEL}/generate", {"text_input": "Hi", "parameters": {"temperature": 0}},
         400, "parameters.temperature"),
        (f"/v2/models/{MODEL}/generate_stream", {"text_input": "Hi", "parameters": {"seed": 0}},
         400, "parameters.seed"),
        (f"/v2/models/{MODEL}/generate", {"text_input": ""}, 400, "text_input"),
        (f"/v2/models/{MODEL}/generate", {"text_input": "Hi", "id": "bad id!"}, 400, "id"),
        ("/v2/models/no-such-model/generate", {"text_input": "Hi"}, 404, "no-such-model"),
        (f"/v2/models/{MODEL}/versions/1/generate", {"text_input": "Hi"}, 404, "version"),
    ],
)  # fmt: skip
def test_rejections_in_the_mindie_shape(
    server: Server, path: str, body: dict[str, Any], status: int, needle: str
) -> None:
    response = server.http.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()
    assert set(error) == {"error", "error_type"}
    assert needle in error["error"]
    ok = server.http.post(f"/v2/models/{MODEL}/generate", json=generate_body("Hi", 1))
    assert ok.status_code == 200, ok.text
