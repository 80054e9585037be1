"""Every rejection rule family on every route, over HTTP: status, the route's error body
(exact keys, docs/api/common.md#error-bodies), the field named (``param`` on ``/v1``; the message
everywhere), and that the server still serves a normal request afterwards.

The Rust validator's own tables (tests/core/test_validate.py) cover each rule's edges; these
cover the HTTP side: that each family reaches the client as the right status and body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from server_harness import MAX_BODY_BYTES, MAX_INPUT_TOKENS, MODEL, ROUTE_PATHS, Server

# A prompt of far more than MAX_INPUT_TOKENS tokens (digits tokenize one or two per token).
LONG = " ".join(str(i) for i in range(200))
LONG_STOP = "x" * 32769
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello world"}]}
CMPL = {"model": MODEL, "prompt": "Hello world"}
GEN: dict[str, Any] = {"text_input": "Hello world"}
DBX_CHAT = {"messages": [{"role": "user", "content": "Hello world"}]}
DBX_CMPL = {"prompt": "Hello world"}
DBX_EMB = {"input": "Hello world"}
MEDIA = [
    {"type": "text", "text": "What is this?"},
    {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}},
]

#: A request each route must still serve after a rejection.
NORMAL = {
    "chat": {**CHAT, "max_tokens": 2},
    "completions": {**CMPL, "max_tokens": 2},
    "generate": {**GEN, "parameters": {"max_new_tokens": 2}},
    "generate_stream": {**GEN, "parameters": {"max_new_tokens": 2}},
    "databricks": {**DBX_CMPL, "max_tokens": 2},
}


@dataclass(frozen=True)
class Bad:
    """One bad request: ``route`` (a key of ROUTE_PATHS), its body (a JSON value, or raw
    bytes), the expected status, the field at fault (None: the body as a whole) and, where it
    matters, the ``/v1`` error code."""

    route: str
    body: Any
    status: int
    param: str | None
    code: str | None = None
    #: Overrides the route's path (unknown names, version segments).
    path: str | None = None
    #: Text the message must contain; default: the field, in backticks.
    mention: str | None = None

    def __str__(self) -> str:
        return self.route


def with_(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**base, **fields}


def gen(**parameters: Any) -> dict[str, Any]:
    return {**GEN, "parameters": parameters}


CASES: dict[str, Bad] = {
    # --- malformed JSON, empty and non-object bodies
    "chat-malformed": Bad("chat", b'{"model": "tiny", "messages": [', 400, None, "invalid_json",
                          mention="not valid JSON"),
    "cmpl-malformed": Bad("completions", b"{'prompt': 1}", 400, None, "invalid_json",
                          mention="not valid JSON"),
    "gen-malformed": Bad("generate", b'{"text_input": "a",}', 400, None, mention="not valid JSON"),
    "gs-malformed": Bad("generate_stream", b"not json", 400, None, mention="not valid JSON"),
    "dbx-malformed": Bad("databricks", b'{"prompt": ', 400, None, mention="not valid JSON"),
    "chat-empty": Bad("chat", b"", 400, None, "invalid_json", mention="empty"),
    "gen-empty": Bad("generate", b"", 400, None, mention="empty"),
    "chat-array": Bad("chat", [CHAT], 400, None, "wrong_type", mention="must be a JSON object"),
    "cmpl-string": Bad("completions", "Hello", 400, None, "wrong_type",
                       mention="must be a JSON object"),
    "gen-array": Bad("generate", [GEN], 400, None, mention="must be a JSON object"),
    "gs-number": Bad("generate_stream", 5, 400, None, mention="must be a JSON object"),
    "dbx-array": Bad("databricks", [DBX_CHAT], 400, None, mention="must be a JSON object"),
    # --- missing required fields
    "chat-no-messages": Bad("chat", {"model": MODEL}, 400, "messages", "missing"),
    "chat-no-model": Bad("chat", {"messages": CHAT["messages"]}, 400, "model", "missing"),
    "cmpl-no-prompt": Bad("completions", {"model": MODEL}, 400, "prompt", "missing"),
    "cmpl-null-prompt": Bad("completions", with_(CMPL, prompt=None), 400, "prompt", "missing"),
    "gen-no-text": Bad("generate", {"parameters": {}}, 400, "text_input"),
    "gs-no-text": Bad("generate_stream", {"id": "a1"}, 400, "text_input"),
    "chat-no-role": Bad("chat", with_(CHAT, messages=[{"content": "hi"}]), 400,
                        "messages[0].role", "missing"),
    "dbx-no-role": Bad("databricks", {"messages": [{"content": "hi"}]}, 400, "messages[0].role"),
    # --- wrong types
    "chat-temperature-str": Bad("chat", with_(CHAT, temperature="hot"), 400, "temperature",
                                "wrong_type"),
    "chat-stream-str": Bad("chat", with_(CHAT, stream="yes"), 400, "stream", "wrong_type"),
    "chat-messages-str": Bad("chat", with_(CHAT, messages="hi"), 400, "messages", "wrong_type"),
    "cmpl-max-tokens-float": Bad("completions", with_(CMPL, max_tokens=1.5), 400, "max_tokens",
                                 "wrong_type"),
    "cmpl-prompt-int": Bad("completions", with_(CMPL, prompt=5), 400, "prompt", "wrong_type"),
    "cmpl-ignore-eos-int": Bad("completions", with_(CMPL, ignore_eos=1), 400, "ignore_eos",
                               "wrong_type"),
    "gen-max-new-str": Bad("generate", gen(max_new_tokens="5"), 400, "parameters.max_new_tokens"),
    "gen-parameters-list": Bad("generate", with_(GEN, parameters=[1]), 400, "parameters"),
    "gs-text-int": Bad("generate_stream", {"text_input": 5}, 400, "text_input"),
    "gs-details-str": Bad("generate_stream", gen(details="yes"), 400, "parameters.details"),
    "dbx-temperature-str": Bad("databricks", with_(DBX_CHAT, temperature="x"), 400,
                               "temperature"),
    "dbx-prompt-int": Bad("databricks", {"prompt": 5}, 400, "prompt"),
    "dbx-input-int": Bad("databricks", {"input": 5}, 400, "input"),
    # --- out-of-range values
    "chat-temperature": Bad("chat", with_(CHAT, temperature=-0.5), 400, "temperature",
                            "out_of_range"),
    "cmpl-temperature": Bad("completions", with_(CMPL, temperature=-1), 400, "temperature",
                            "out_of_range"),
    "gen-temperature-0": Bad("generate", gen(temperature=0), 400, "parameters.temperature"),
    "dbx-temperature": Bad("databricks", with_(DBX_CHAT, temperature=2.5), 400, "temperature"),
    "chat-top-p": Bad("chat", with_(CHAT, top_p=0), 400, "top_p", "out_of_range"),
    "cmpl-top-p": Bad("completions", with_(CMPL, top_p=1e-7), 400, "top_p", "out_of_range"),
    "gs-top-p": Bad("generate_stream", gen(top_p=1.5), 400, "parameters.top_p"),
    "dbx-top-p": Bad("databricks", with_(DBX_CMPL, top_p=1.5), 400, "top_p"),
    "chat-top-k-0": Bad("chat", with_(CHAT, top_k=0), 400, "top_k", "out_of_range"),
    "cmpl-top-k-neg": Bad("completions", with_(CMPL, top_k=-2), 400, "top_k", "out_of_range"),
    "gen-top-k-neg": Bad("generate", gen(top_k=-1), 400, "parameters.top_k"),
    "dbx-top-k-0": Bad("databricks", with_(DBX_CHAT, top_k=0), 400, "top_k"),
    "cmpl-seed-0": Bad("completions", with_(CMPL, seed=0), 400, "seed", "out_of_range"),
    "gen-seed-0": Bad("generate", gen(seed=0), 400, "parameters.seed"),
    "chat-seed-neg": Bad("chat", with_(CHAT, seed=-1), 400, "seed", "out_of_range"),
    "chat-max-tokens-0": Bad("chat", with_(CHAT, max_tokens=0), 400, "max_tokens",
                             "out_of_range"),
    "cmpl-max-tokens-0": Bad("completions", with_(CMPL, max_tokens=0), 400, "max_tokens",
                             "out_of_range"),
    "gs-max-new-0": Bad("generate_stream", gen(max_new_tokens=0), 400,
                        "parameters.max_new_tokens"),
    "dbx-max-tokens-0": Bad("databricks", with_(DBX_CMPL, max_tokens=0), 400, "max_tokens"),
    "chat-rep-penalty-0": Bad("chat", with_(CHAT, repetition_penalty=0), 400,
                              "repetition_penalty", "out_of_range"),
    "cmpl-rep-penalty-big": Bad("completions", with_(CMPL, repetition_penalty=2.5), 400,
                                "repetition_penalty", "out_of_range"),
    "gen-rep-penalty-0": Bad("generate", gen(repetition_penalty=0), 400,
                             "parameters.repetition_penalty"),
    "chat-presence": Bad("chat", with_(CHAT, presence_penalty=2.5), 400, "presence_penalty",
                         "out_of_range"),
    "cmpl-frequency": Bad("completions", with_(CMPL, frequency_penalty=-3), 400,
                          "frequency_penalty", "out_of_range"),
    "cmpl-n-0": Bad("completions", with_(CMPL, n=0), 400, "n", "out_of_range"),
    "cmpl-n-129": Bad("completions", with_(CMPL, n=129), 400, "n", "out_of_range"),
    "chat-n-0": Bad("chat", with_(CHAT, n=0), 400, "n", "out_of_range"),
    "dbx-n-0": Bad("databricks", with_(DBX_CHAT, n=0), 400, "n"),
    "cmpl-n-greedy": Bad("completions", with_(CMPL, n=2, temperature=0), 400, "temperature",
                         "conflict"),
    "cmpl-logprobs-6": Bad("completions", with_(CMPL, logprobs=6), 400, "logprobs",
                           "out_of_range"),
    "chat-top-logprobs-21": Bad("chat", with_(CHAT, logprobs=True, top_logprobs=21), 400,
                                "top_logprobs", "out_of_range"),
    "chat-top-logprobs-alone": Bad("chat", with_(CHAT, top_logprobs=2), 400, "top_logprobs",
                                   "conflict"),
    "dbx-top-logprobs-alone": Bad("databricks", with_(DBX_CHAT, top_logprobs=2), 400,
                                  "top_logprobs"),
    "chat-stop-long": Bad("chat", with_(CHAT, stop=LONG_STOP), 400, "stop", "too_long"),
    "cmpl-stop-list-long": Bad("completions", with_(CMPL, stop=["a", LONG_STOP[1:]]), 400,
                               "stop", "too_long"),
    "dbx-stop-long": Bad("databricks", with_(DBX_CMPL, stop=LONG_STOP), 400, "stop"),
    "cmpl-stop-empty-element": Bad("completions", with_(CMPL, stop=["a", ""]), 400, "stop[1]",
                                   "empty"),
    "chat-stop-token-null": Bad("chat", with_(CHAT, stop_token_ids=[None]), 400,
                                "stop_token_ids[0]"),
    "cmpl-stop-token-null": Bad("completions", with_(CMPL, stop_token_ids=[5, None]), 400,
                                "stop_token_ids[1]"),
    "gs-id-pattern": Bad("generate_stream", with_(GEN, id="a b"), 400, "id"),
    "gen-id-long": Bad("generate", with_(GEN, id="a" * 257), 400, "id"),
    "gen-id-empty": Bad("generate", with_(GEN, id=""), 400, "id"),
    "gen-priority-0": Bad("generate", gen(priority=0), 400, "parameters.priority"),
    "gs-priority-6": Bad("generate_stream", gen(priority=6), 400, "parameters.priority"),
    "gen-timeout-0": Bad("generate", gen(timeout=0), 400, "parameters.timeout"),
    "gs-timeout-3601": Bad("generate_stream", gen(timeout=3601), 400, "parameters.timeout"),
    "gen-typical-p": Bad("generate", gen(typical_p=-1), 400, "parameters.typical_p"),
    "gs-typical-p": Bad("generate_stream", gen(typical_p=-1.0), 400, "parameters.typical_p"),
    "gs-batch-size-0": Bad("generate_stream", gen(batch_size=0), 400, "parameters.batch_size"),
    "chat-bad-role": Bad("chat", with_(CHAT, messages=[{"role": "robot", "content": "hi"}]), 400,
                         "messages[0].role"),
    "chat-empty-messages": Bad("chat", with_(CHAT, messages=[]), 400, "messages"),
    "gen-empty-text": Bad("generate", with_(GEN, text_input=""), 400, "text_input"),
    "cmpl-empty-prompt": Bad("completions", with_(CMPL, prompt=""), 400, "prompt"),
    # --- a prompt over the token limit (MAX_INPUT_TOKENS)
    "chat-too-long": Bad("chat", with_(CHAT, messages=[{"role": "user", "content": LONG}]), 400,
                         "messages"),
    "cmpl-too-long": Bad("completions", with_(CMPL, prompt=LONG), 400, "prompt"),
    "cmpl-batch-too-long": Bad("completions", with_(CMPL, prompt=["Hello", LONG]), 400,
                               "prompt[1]"),
    "gen-too-long": Bad("generate", with_(GEN, text_input=LONG), 400, "text_input"),
    "gs-too-long": Bad("generate_stream", with_(GEN, text_input=LONG), 400, "text_input"),
    "dbx-chat-too-long": Bad("databricks", {"messages": [{"role": "user", "content": LONG}]},
                             400, "messages"),
    "dbx-cmpl-too-long": Bad("databricks", {"prompt": LONG}, 400, "prompt"),
    # --- unknown model / endpoint / version
    "chat-unknown-model": Bad("chat", with_(CHAT, model="gpt-4"), 404, "model",
                              "model_not_found", mention="'gpt-4'"),
    "cmpl-unknown-model": Bad("completions", with_(CMPL, model="gpt-4"), 404, "model",
                              "model_not_found", mention="'gpt-4'"),
    "gen-unknown-model": Bad("generate", GEN, 404, "model", path="/v2/models/gpt-4/generate",
                             mention="'gpt-4'"),
    "gs-unknown-model": Bad("generate_stream", GEN, 404, "model",
                            path="/v2/models/gpt-4/generate_stream", mention="'gpt-4'"),
    "dbx-unknown-name": Bad("databricks", DBX_CHAT, 404, None,
                            path="/serving-endpoints/gpt-4/invocations", mention="'gpt-4'"),
    "gen-version": Bad("generate", GEN, 404, None, path=f"/v2/models/{MODEL}/versions/1/generate",
                       mention="versions"),
    "gs-version": Bad("generate_stream", GEN, 404, None,
                      path=f"/v2/models/{MODEL}/versions/1/generate_stream", mention="versions"),
    # --- media parts on a text-only model
    "chat-media": Bad("chat", with_(CHAT, messages=[{"role": "user", "content": MEDIA}]), 400,
                      "messages[0].content[1].type", "unsupported_content_type"),
    "gen-media": Bad("generate", with_(GEN, text_input=MEDIA), 400, "text_input[1].type"),
    "gs-media": Bad("generate_stream", with_(GEN, text_input=MEDIA), 400, "text_input[1].type"),
    "dbx-media": Bad("databricks", {"messages": [{"role": "user", "content": MEDIA}]}, 400,
                     "messages[0].content[1].type"),
    # --- features not built: refused, never ignored
    # --- tools: a named choice must name one of them; another grammar with them conflicts
    "chat-tool-choice": Bad("chat", with_(CHAT, tools=[{"type": "function", "function": {
        "name": "f"}}], tool_choice={"type": "function", "function": {"name": "g"}}), 400,
        "tool_choice.function.name"),
    "dbx-tools-grammar": Bad("databricks", with_(DBX_CHAT, tools=[{"type": "function",
        "function": {"name": "f"}}], response_format={"type": "json_object"}), 400,
        "response_format", "conflict"),
    # --- structured output: served; a malformed grammar names its field
    "chat-bad-schema": Bad("chat", with_(CHAT, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}}), 400,
        "response_format", "invalid_grammar"),
    "dbx-bad-schema": Bad("databricks", with_(DBX_CHAT, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}}), 400,
        "response_format"),
    # --- beam search: served; it does not sample, and its options need it
    "cmpl-beam-top-p": Bad("completions", with_(CMPL, use_beam_search=True, top_p=0.5), 400,
                           "top_p", "conflict", mention="does not sample"),
    "cmpl-beam-stop": Bad("completions", with_(CMPL, use_beam_search=True, stop=["x"]), 400,
                          "stop", "conflict"),
    "cmpl-length-penalty-alone": Bad("completions", with_(CMPL, length_penalty=2.0), 400,
                                     "length_penalty", "conflict"),
    "cmpl-beam-wide": Bad("completions", with_(CMPL, use_beam_search=True, best_of=9), 400,
                          "best_of", "out_of_range", mention="at most 8"),
    # --- best_of: served above n without streaming; a stream shows every sample, so no choice
    "cmpl-best-of-stream": Bad("completions", with_(CMPL, stream=True, n=2, best_of=3), 400,
                               "best_of", "conflict", mention="when streaming"),
    "cmpl-best-of-stream-alone": Bad("completions", with_(CMPL, stream=True, best_of=2), 400,
                                     "best_of", "conflict"),
    "cmpl-best-of-below-n": Bad("completions", with_(CMPL, n=3, best_of=2), 400, "best_of",
                                "conflict", mention=">= `n` (3)"),
    "cmpl-best-of-greedy": Bad("completions", with_(CMPL, best_of=2, temperature=0), 400,
                               "temperature", "conflict"),
    "cmpl-suffix": Bad("completions", with_(CMPL, suffix="!"), 400, "suffix", "unsupported"),
    # --- prompt logprobs and token-id prompts (built; bad values still get 400)
    "cmpl-max-tokens-0-no-echo": Bad("completions", with_(CMPL, max_tokens=0, logprobs=1), 400,
                                     "max_tokens", "out_of_range", mention="only with `echo"),
    "cmpl-prompt-logprobs-21": Bad("completions", with_(CMPL, prompt_logprobs=21), 400,
                                   "prompt_logprobs", "out_of_range"),
    "chat-prompt-logprobs-stream": Bad("chat", with_(CHAT, prompt_logprobs=1, stream=True), 400,
                                       "prompt_logprobs", "conflict"),
    "cmpl-prompt-ids-out-of-vocab": Bad("completions", with_(CMPL, prompt=[1, 10**9]), 400,
                                        "prompt[1]", "out_of_range", mention="`prompt[1]`"),
    "cmpl-prompt-ids-nested-bad": Bad("completions", with_(CMPL, prompt=[[1], [-5]]), 400,
                                      "prompt[1][0]", "out_of_range"),
    "cmpl-prompt-ids-mixed": Bad("completions", with_(CMPL, prompt=[[1, 2], "a"]), 400,
                                 "prompt[1]", "wrong_type"),
    "dbx-cmpl-logprobs-6": Bad("databricks", with_(DBX_CMPL, logprobs=6), 400, "logprobs"),
    "dbx-embeddings": Bad("databricks", DBX_EMB, 400, "input"),
    # --- Databricks task keys: exactly one of messages / prompt / input
    "dbx-no-task": Bad("databricks", {"max_tokens": 2}, 400, None, mention="found none"),
    "dbx-two-tasks": Bad("databricks", {**DBX_CHAT, **DBX_CMPL}, 400, None,
                         mention="found `messages`, `prompt`"),
    "dbx-three-tasks": Bad("databricks", {**DBX_CHAT, **DBX_CMPL, **DBX_EMB}, 400, None,
                           mention="found `messages`, `prompt`, `input`"),
}  # fmt: skip


def error_of(route: str, response: httpx.Response) -> tuple[str, str | None, str | None]:
    """(message, param, code) of an error body, checking the route's exact shape."""
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    if route in ("chat", "completions"):
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        error = body["error"]
        assert error["type"] == "invalid_request_error", body  # every 4xx here
        return error["message"], error["param"], error["code"]
    if route.startswith("generate"):
        assert set(body) == {"error", "error_type"}, body
        assert isinstance(body["error"], str)
        assert isinstance(body["error_type"], str)
        expected = {
            400: "validation",
            404: "not_found",
            405: "method_not_allowed",
            409: "conflict",
            413: "validation",
        }
        assert body["error_type"] == expected[response.status_code], body
        return body["error"], None, None
    assert set(body) == {"error_code", "message"}, body
    expected = {
        400: "BAD_REQUEST",
        404: "RESOURCE_DOES_NOT_EXIST",
        405: "BAD_REQUEST",
        413: "BAD_REQUEST",
    }
    assert body["error_code"] == expected[response.status_code], body
    return body["message"], None, None


def assert_serves(server: Server, route: str) -> None:
    """The server still answers a normal request on ``route``."""
    response = server.post(ROUTE_PATHS[route], NORMAL[route])
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_rejected(server: Server, case: Bad) -> None:
    path = case.path or ROUTE_PATHS[case.route]
    if isinstance(case.body, bytes):
        response = server.post(path, content=case.body)
    else:
        response = server.post(path, case.body)
    assert response.status_code == case.status, response.text
    message, param, code = error_of(case.route, response)
    assert message
    if case.route in ("chat", "completions"):
        assert param == case.param, (param, message)
        if case.code is not None:
            assert code == case.code, (code, message)
    mention = case.mention or (None if case.param is None else f"`{case.param}`")
    if mention is not None:
        assert mention in message, message
    assert_serves(server, case.route)


def test_body_too_large_with_content_length(server: Server) -> None:
    body = json.dumps({**CMPL, "prompt": "x" * MAX_BODY_BYTES}).encode()
    for route in ROUTE_PATHS:
        response = server.post(ROUTE_PATHS[route], content=body)
        assert response.status_code == 413, response.text
        message, _, code = error_of(route, response)
        assert str(MAX_BODY_BYTES) in message
        if route in ("chat", "completions"):
            assert code == "body_too_large"
        assert_serves(server, route)


def test_body_too_large_chunked(server: Server) -> None:
    """Without ``content-length`` the limit holds while the body is read."""
    chunk = b"x" * 4096

    async def post(path: str) -> httpx.Response:
        async def body() -> Any:
            for _ in range(MAX_BODY_BYTES // len(chunk) + 2):
                yield chunk

        return await server.client().post(path, content=body())

    for route in ("chat", "generate_stream", "databricks"):
        response = server.run(post(ROUTE_PATHS[route]))
        assert "content-length" not in response.request.headers
        assert response.status_code == 413, response.text
        error_of(route, response)
        assert_serves(server, route)


def test_body_at_limit_is_read(server: Server) -> None:
    """A body just under the limit is read whole (then judged on its content)."""
    prompt = "x" * (MAX_BODY_BYTES - 200)
    body = json.dumps({**CMPL, "prompt": prompt, "max_tokens": 1}).encode()
    assert len(body) <= MAX_BODY_BYTES
    response = server.post(ROUTE_PATHS["completions"], content=body)
    assert response.status_code == 400, response.text  # too many tokens, not too many bytes
    assert response.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/v1/nothing", 404, None),
        ("POST", "/v3/models/tiny/generate", 404, None),
        ("POST", "/", 404, None),  # GET / is the playground (test_server_playground.py)
        ("GET", "/playground/nothing.js", 404, None),
        ("GET", "/v1/completions", 405, "POST"),
        ("DELETE", "/v1/chat/completions", 405, "POST"),
        ("GET", f"/v2/models/{MODEL}/generate", 405, "POST"),
        ("POST", "/v1/models", 405, "GET"),
        ("POST", "/health", 405, "GET"),
        ("GET", f"/serving-endpoints/{MODEL}/invocations", 405, "POST"),
    ],
)
def test_unknown_path_and_wrong_method(
    server: Server, method: str, path: str, status: int, allow: str | None
) -> None:
    response = server.request(method, path)
    assert response.status_code == status, response.text
    route = (
        "generate"
        if path.startswith("/v2/")
        else "databricks"
        if path.startswith("/serving-endpoints/")
        else "chat"
    )
    message, param, code = error_of(route, response)
    assert path in message
    if route == "chat":
        assert param is None
        assert code == ("not_found" if status == 404 else "method_not_allowed")
    if allow is not None:
        assert response.headers["allow"] == allow
        assert method in message
    assert_serves(server, "completions")


def test_chat_seed_zero_is_allowed(server: Server) -> None:
    """Seed 0 is excluded on completions and generate but allowed on chat
    (docs/decisions.md#seed-ranges)."""
    response = server.post(ROUTE_PATHS["chat"], {**CHAT, "seed": 0, "max_tokens": 2})
    assert response.status_code == 200, response.text


def test_input_token_limit_is_exact(server: Server) -> None:
    """MAX_INPUT_TOKENS prompt tokens pass; one more is refused, naming the limit."""
    tokenizer = server.tokenizer
    words = " ".join(str(i) for i in range(100))
    ids = tokenizer.encode(words)
    fits = tokenizer.decode(ids[:MAX_INPUT_TOKENS])
    over = tokenizer.decode(ids[: MAX_INPUT_TOKENS + 1])
    assert len(tokenizer.encode(fits)) == MAX_INPUT_TOKENS
    assert len(tokenizer.encode(over)) == MAX_INPUT_TOKENS + 1
    ok = server.post(ROUTE_PATHS["completions"], {**CMPL, "prompt": fits, "max_tokens": 1})
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["prompt_tokens"] == MAX_INPUT_TOKENS
    bad = server.post(ROUTE_PATHS["completions"], {**CMPL, "prompt": over, "max_tokens": 1})
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"]["param"] == "prompt"
    assert str(MAX_INPUT_TOKENS) in bad.json()["error"]["message"]
