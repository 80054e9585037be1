"""Streaming over HTTP: SSE framing and chunk shapes per route (docs/api/common.md#streaming),
deltas that add up to the non-streamed text, ``fullTextEnabled``, MindIE ids and the 409 for a
duplicate in-flight id."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from typing import Any

import pytest
from server_harness import MODEL, ROUTE_PATHS, Server, sse_json

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "Hello world"}]
NUM_TOKENS = 8
#: Greedy, a fixed length: every route below produces NUM_TOKENS tokens.
CHAT = {"model": MODEL, "messages": MESSAGES, "max_tokens": NUM_TOKENS, "temperature": 0,
        "ignore_eos": True}  # fmt: skip
CMPL = {"model": MODEL, "prompt": PROMPT, "max_tokens": NUM_TOKENS, "temperature": 0,
        "ignore_eos": True}  # fmt: skip
DBX_CHAT = {"messages": MESSAGES, "max_tokens": NUM_TOKENS, "temperature": 0}
DBX_CMPL = {"prompt": PROMPT, "max_tokens": NUM_TOKENS, "temperature": 0}
GEN = {"text_input": PROMPT, "parameters": {"max_new_tokens": NUM_TOKENS, "do_sample": False}}

MINDIE_ID = re.compile(r"^endpoint_common_\d+$")
CHUNK_KEYS = {"id", "object", "created", "model", "choices"}
STREAM_FRAME_KEYS = {"id", "model_name", "model_version", "text_output", "prefill_time",
                     "decode_time"}  # fmt: skip
DETAILS_KEYS = {"generated_tokens", "first_token_cost", "decode_cost", "batch_size",
                "queue_wait_time"}  # fmt: skip


def stream(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "stream": True}


def with_params(**parameters: Any) -> dict[str, Any]:
    return {**GEN, "parameters": {**GEN["parameters"], **parameters}}


def check_chat_chunks(chunks: list[dict[str, Any]], *, mindie: bool) -> None:
    """The chat chunk shape: one id and ``created`` throughout, role in every delta, usage
    and a finish reason on the last chunk only, no timing extensions
    (docs/api/openai.md#chat-stream)."""
    assert chunks
    first = chunks[0]
    if mindie:
        assert MINDIE_ID.match(first["id"]), first["id"]
    else:
        assert not MINDIE_ID.match(first["id"]), first["id"]
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        assert set(chunk) == CHUNK_KEYS | ({"usage"} if last else set()), chunk
        assert chunk["object"] == "chat.completion.chunk"
        assert (chunk["id"], chunk["created"], chunk["model"]) == (
            first["id"],
            first["created"],
            MODEL,
        )
        [choice] = chunk["choices"]
        assert set(choice) == {"index", "delta", "logprobs", "finish_reason"}, choice
        assert choice["index"] == 0
        assert choice["logprobs"] is None
        assert set(choice["delta"]) == {"role", "content"}
        assert choice["delta"]["role"] == "assistant"
        assert isinstance(choice["delta"]["content"], str)
        assert (choice["finish_reason"] is not None) == last, chunk


def check_usage(usage: dict[str, Any], prompt_tokens: int, completion_tokens: int) -> None:
    assert usage["prompt_tokens"] == prompt_tokens
    assert usage["completion_tokens"] == completion_tokens
    assert usage["total_tokens"] == prompt_tokens + completion_tokens


def test_chat_stream(server: Server) -> None:
    whole = server.post(ROUTE_PATHS["chat"], CHAT).json()
    chunks = sse_json(server.post(ROUTE_PATHS["chat"], stream(CHAT)), done=True)
    check_chat_chunks(chunks, mindie=True)
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == whole["usage"]
    prompt_tokens = len(server.tokenizer.encode_chat(MESSAGES))
    check_usage(chunks[-1]["usage"], prompt_tokens, NUM_TOKENS)
    assert chunks[0]["id"] != whole["id"]  # a fresh id per request


def test_chat_whole_response(server: Server) -> None:
    """The non-streamed chat carries MindIE's timing extensions (docs/api/openai.md#chat-response,
    docs/decisions.md#chat-timing-fields)."""
    response = server.post(ROUTE_PATHS["chat"], CHAT)
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == CHUNK_KEYS | {"usage", "prefill_time", "decode_time_arr"}
    assert body["object"] == "chat.completion"
    assert MINDIE_ID.match(body["id"])
    [choice] = body["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason", "stop_reason"}
    assert choice["message"]["role"] == "assistant"
    assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)
    assert isinstance(body["prefill_time"], float) and body["prefill_time"] > 0
    assert len(body["decode_time_arr"]) == NUM_TOKENS - 1
    assert all(isinstance(t, float) and t > 0 for t in body["decode_time_arr"])


def test_completions_stream(server: Server) -> None:
    whole = server.post(ROUTE_PATHS["completions"], CMPL).json()
    chunks = sse_json(server.post(ROUTE_PATHS["completions"], stream(CMPL)), done=True)
    first = chunks[0]
    assert MINDIE_ID.match(first["id"])
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        assert set(chunk) == CHUNK_KEYS | ({"usage"} if last else set()), chunk
        assert chunk["object"] == "text_completion"
        assert (chunk["id"], chunk["created"], chunk["model"]) == (
            first["id"],
            first["created"],
            MODEL,
        )
        [choice] = chunk["choices"]
        assert set(choice) == {"index", "text", "logprobs", "finish_reason", "stop_reason"}
        assert choice["index"] == 0
        assert (choice["finish_reason"] is not None) == last
        assert choice["stop_reason"] is None
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    usage = chunks[-1]["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens", "batch_size",
                          "queue_wait_time"}  # fmt: skip
    check_usage(usage, len(server.tokenizer.encode(PROMPT)), NUM_TOKENS)
    assert len(usage["batch_size"]) == len(usage["queue_wait_time"]) == NUM_TOKENS
    assert all(isinstance(b, int) and b >= 1 for b in usage["batch_size"])
    assert all(isinstance(w, int) and w >= 0 for w in usage["queue_wait_time"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # The whole response reports the same arrays' shape.
    assert len(whole["usage"]["batch_size"]) == len(whole["usage"]["queue_wait_time"]) == 8


def test_databricks_chat_stream(server: Server) -> None:
    path = ROUTE_PATHS["databricks"]
    whole = server.post(path, DBX_CHAT).json()
    # no MindIE extensions (docs/api/databricks.md#endpoint-and-task)
    assert set(whole) == CHUNK_KEYS | {"usage"}
    assert whole["object"] == "chat.completion"
    chunks = sse_json(server.post(path, stream(DBX_CHAT)), done=True)
    check_chat_chunks(chunks, mindie=False)
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"] == whole["usage"]
    assert set(whole["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


def test_databricks_completions_stream(server: Server) -> None:
    path = ROUTE_PATHS["databricks"]
    whole = server.post(path, DBX_CMPL).json()
    assert set(whole) == CHUNK_KEYS | {"usage"}
    assert set(whole["choices"][0]) == {"index", "text", "finish_reason"}
    chunks = sse_json(server.post(path, stream(DBX_CMPL)), done=True)
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        assert set(chunk) == CHUNK_KEYS | ({"usage"} if last else set()), chunk
        assert chunk["object"] == "text_completion"
        [choice] = chunk["choices"]
        assert set(choice) == {"index", "text", "finish_reason"}
        assert (choice["finish_reason"] is not None) == last
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["usage"] == whole["usage"]
    assert set(whole["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


def check_frames(frames: list[dict[str, Any]], *, details: bool, response_id: str) -> None:
    """generate_stream frames (docs/api/mindie.md#timing-fields): timings on the right frames,
    details per docs/decisions.md#details-when-not-asked-for, finish_reason only on the last frame,
    generated_tokens rising one per frame."""
    assert frames
    for i, frame in enumerate(frames):
        last = i == len(frames) - 1
        has_details = details or last
        assert set(frame) == STREAM_FRAME_KEYS | ({"details"} if has_details else set()), frame
        assert frame["id"] == response_id
        assert frame["model_name"] == MODEL
        assert frame["model_version"] is None
        assert isinstance(frame["text_output"], str)
        if i == 0:
            assert isinstance(frame["prefill_time"], float) and frame["prefill_time"] > 0
            assert frame["decode_time"] is None
        else:
            assert frame["prefill_time"] is None
            assert isinstance(frame["decode_time"], float) and frame["decode_time"] > 0
        if has_details:
            d = frame["details"]
            assert set(d) == DETAILS_KEYS | ({"finish_reason"} if last else set()), d
            assert d["generated_tokens"] == i + 1
            assert d["first_token_cost"] is None and d["decode_cost"] is None
            assert isinstance(d["batch_size"], int) and d["batch_size"] >= 1
            assert isinstance(d["queue_wait_time"], int) and d["queue_wait_time"] >= 0


@pytest.mark.parametrize("details", [False, True])
def test_generate_stream(server: Server, details: bool) -> None:
    body = with_params(details=details)
    frames = sse_json(server.post(ROUTE_PATHS["generate_stream"], body), done=False)
    check_frames(frames, details=details, response_id=frames[0]["id"])
    assert MINDIE_ID.match(frames[0]["id"])
    assert len(frames) == NUM_TOKENS
    assert frames[-1]["details"]["finish_reason"] == "length"
    whole = server.post(ROUTE_PATHS["generate"], body).json()
    assert "".join(f["text_output"] for f in frames) == whole["text_output"]


def test_generate_stream_echoes_client_id(server: Server) -> None:
    body = {**with_params(details=True), "id": "client-Id_7"}
    frames = sse_json(server.post(ROUTE_PATHS["generate_stream"], body), done=False)
    check_frames(frames, details=True, response_id="client-Id_7")
    whole = server.post(ROUTE_PATHS["generate"], body).json()
    assert whole["id"] == "client-Id_7"
    # Once a request with that id has finished, the id is free again.
    again = server.post(ROUTE_PATHS["generate_stream"], body)
    assert again.status_code == 200


def test_generate_whole_response(server: Server) -> None:
    response = server.post(ROUTE_PATHS["generate"], GEN)
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"id", "model_name", "model_version", "text_output", "details",
                         "prefill_time", "decode_time_arr"}  # fmt: skip
    assert MINDIE_ID.match(body["id"])
    assert (body["model_name"], body["model_version"]) == (MODEL, None)
    assert set(body["details"]) == DETAILS_KEYS | {"finish_reason"}
    assert body["details"]["finish_reason"] == "length"
    assert body["details"]["generated_tokens"] == NUM_TOKENS
    assert isinstance(body["prefill_time"], float)
    assert len(body["decode_time_arr"]) == NUM_TOKENS - 1


def test_generated_ids_count_up(server: Server) -> None:
    """Generated ids are ``endpoint_common_<n>``, fresh per request across MindIE routes."""
    ids = [
        server.post(ROUTE_PATHS["generate"], GEN).json()["id"],
        server.post(ROUTE_PATHS["chat"], CHAT).json()["id"],
        server.post(ROUTE_PATHS["completions"], CMPL).json()["id"],
    ]
    numbers = [int(i.removeprefix("endpoint_common_")) for i in ids]
    assert numbers == sorted(set(numbers)), ids


async def _first_chunk_then_hold(server: Server, body: dict[str, Any]) -> Any:
    """Start a generate_stream whose client stops reading after the first event: the request
    stays in flight until ``release`` is set. Returns (task, first_event, release)."""
    first = asyncio.Event()
    release = asyncio.Event()
    messages: list[dict[str, Any]] = []
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await asyncio.Event().wait()  # never disconnects
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            first.set()
            await release.wait()

    scope = _scope("POST", ROUTE_PATHS["generate_stream"])
    task = asyncio.create_task(server.app(scope, receive, send))
    await asyncio.wait_for(first.wait(), 30)
    return task, messages, release


def _scope(method: str, path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }


def test_duplicate_client_id_in_flight_is_409(server: Server) -> None:
    body = {
        "id": "dup-1",
        "text_input": PROMPT,
        "parameters": {"max_new_tokens": 64, "do_sample": False},
    }

    async def scenario() -> tuple[Any, Any, list[dict[str, Any]]]:
        task, messages, release = await _first_chunk_then_hold(server, body)
        assert "dup-1" in server.engine.client_ids
        client = server.client()
        conflict_stream = await client.post(ROUTE_PATHS["generate_stream"], json=body)
        conflict_once = await client.post(ROUTE_PATHS["generate"], json=body)
        release.set()
        await asyncio.wait_for(task, 30)
        return conflict_stream, conflict_once, messages

    conflict_stream, conflict_once, messages = server.run(scenario())
    for response in (conflict_stream, conflict_once):
        assert response.status_code == 409, response.text
        assert response.json() == {
            "error": "a request with `id` 'dup-1' is already running",
            "error_type": "conflict",
        }
    # The first request ran to its end undisturbed.
    assert messages[0]["status"] == 200
    assert messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert "dup-1" not in server.engine.client_ids
    again = server.post(ROUTE_PATHS["generate"], {**body, "parameters": {"max_new_tokens": 2}})
    assert again.status_code == 200, again.text


# --- fullTextEnabled (docs/api/mindie.md#full-text, docs/decisions.md#where-full-text-applies)


def test_full_text_generate_stream_is_cumulative(server: Server) -> None:
    app = server.full_text_app
    frames = sse_json(server.post(ROUTE_PATHS["generate_stream"], GEN, app=app), done=False)
    check_frames(frames, details=False, response_id=frames[0]["id"])
    texts = [f["text_output"] for f in frames]
    for previous, current in itertools.pairwise(texts):
        assert current.startswith(previous), (previous, current)
    whole = server.post(ROUTE_PATHS["generate"], GEN, app=app).json()
    assert texts[-1] == whole["text_output"]
    # The same text as the incremental server's deltas.
    deltas = sse_json(server.post(ROUTE_PATHS["generate_stream"], GEN), done=False)
    assert "".join(f["text_output"] for f in deltas) == texts[-1]
    assert len(set(texts)) > 1  # the text did grow frame by frame


def test_full_text_chat_is_cumulative(server: Server) -> None:
    app = server.full_text_app
    whole = server.post(ROUTE_PATHS["chat"], CHAT, app=app).json()
    assert "full_text" not in whole
    text = whole["choices"][0]["message"]["content"]
    chunks = sse_json(server.post(ROUTE_PATHS["chat"], stream(CHAT), app=app), done=True)
    contents = [c["choices"][0]["delta"]["content"] for c in chunks]
    for previous, current in itertools.pairwise(contents):
        assert current.startswith(previous), (previous, current)
    assert contents[-1] == text
    assert chunks[-1]["full_text"] == text
    assert all("full_text" not in c for c in chunks[:-1])
    # Otherwise the chunks are shaped as usual.
    last = {k: v for k, v in chunks[-1].items() if k != "full_text"}
    check_chat_chunks([*chunks[:-1], last], mindie=True)


@pytest.mark.parametrize("route", ["completions", "databricks"])
def test_full_text_leaves_other_streams_incremental(server: Server, route: str) -> None:
    app = server.full_text_app
    body = CMPL if route == "completions" else DBX_CHAT
    whole = server.post(ROUTE_PATHS[route], body, app=app).json()
    chunks = sse_json(server.post(ROUTE_PATHS[route], stream(body), app=app), done=True)
    if route == "completions":
        text = whole["choices"][0]["text"]
        deltas = [c["choices"][0]["text"] for c in chunks]
    else:
        text = whole["choices"][0]["message"]["content"]
        deltas = [c["choices"][0]["delta"]["content"] for c in chunks]
    assert "".join(deltas) == text
    assert all("full_text" not in c for c in chunks)
