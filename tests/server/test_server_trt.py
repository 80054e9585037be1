"""An `Executor` shares the server's engine (docs/api/trt.md#executor, docs/api/trt.md#sampling):
the same request through the TRT-style API and through ``/v1/completions`` with equivalent
parameters gives the same tokens, greedy and seeded, while both run on one engine thread."""

from __future__ import annotations

from typing import Any

import pytest
from server_harness import MODEL, Server

from ferrollm.trt import Executor, InferenceRequest

PROMPT = [5, 6, 7, 8, 9, 10, 11]
MAX_TOKENS = 10

#: (completions body, equivalent TRT tensors) per docs/api/trt.md#sampling.
CASES = {
    "greedy": ({"temperature": 0}, {}),
    "seeded": (
        {"temperature": 0.9, "top_p": 1.0, "seed": 1234},
        {"temperature": 0.9, "runtime_top_k": 0, "runtime_top_p": 1.0, "random_seed": 1234},
    ),
    "seeded_top_k": (
        {"temperature": 1.3, "top_k": 20, "top_p": 0.9, "seed": 7},
        {"temperature": 1.3, "runtime_top_k": 20, "runtime_top_p": 0.9, "random_seed": 7},
    ),
}


@pytest.fixture(scope="module")
def executor(server: Server) -> Executor:
    # The server has used the engine first, so the Executor joins its event loop.
    response = server.post("/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 1})
    assert response.status_code == 200, response.text
    executor = Executor(server.engine)
    assert executor.engine.event_loop is server.loop
    return executor


@pytest.mark.parametrize("case", list(CASES))
def test_executor_and_completions_give_the_same_tokens(
    server: Server, executor: Executor, case: str
) -> None:
    http, trt = CASES[case]
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,  # TRT's end_id -1 (docs/decisions.md#the-end-id-default)
        **http,
    }
    response = executor.generate(InferenceRequest(PROMPT, MAX_TOKENS, **trt), timeout=60)
    assert response.err_msg == ""
    assert response.output_ids is not None
    trt_tokens = response.output_ids[0].tolist()
    assert len(trt_tokens) == MAX_TOKENS
    engine_out = server.engine_run("completions", body, PROMPT)
    assert engine_out.outputs[0].token_ids == trt_tokens
    if case != "greedy":  # the seeded cases really sample
        greedy = executor.generate(InferenceRequest(PROMPT, MAX_TOKENS), timeout=60)
        assert greedy.output_ids is not None and greedy.output_ids[0].tolist() != trt_tokens
    reply = server.post("/v1/completions", body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == server.tokenizer.decode(trt_tokens)
