"""End-to-end fixtures: real ``ferrollm serve`` processes, and the offline engine as the oracle.

``server`` (package) serves the default model with default options (fullTextEnabled off);
``full_text_server`` (module) is a second one with ``--full-text`` for the module that needs
it. Both processes are launched together when the first e2e test starts (the second only if a
collected test uses it), so that their start-ups and the offline engine's load overlap; each
fixture then waits for its server to be ready, and every server is stopped at the end of its
scope, or at exit if a teardown never ran.

``oracle`` is the offline `ferrollm.LLM` on the same model: the servers' greedy text must equal
it (the offline engine is parity-tested against transformers in tests/engine).
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from ferrollm import LLM
from ferrollm.tokenizer import Tokenizer

from .e2e_support import (
    CODE_PROMPT,
    PROMPT,
    PROMPT_TOKENS,
    QUESTION,
    QUESTION_TOKENS,
    STORY,
    STORY_TOKENS,
    Oracle,
    Server,
    launch_server,
)


@pytest.fixture(scope="package")
def launched(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Server]]:
    """The server processes, started (not yet ready) by name; at the end, their logs must
    hold no traceback."""
    wanted = {"server": ()}
    if any("full_text_server" in item.fixturenames for item in request.session.items):
        wanted["full_text_server"] = ("--full-text",)
    servers: dict[str, Server] = {}
    try:
        for name, flags in wanted.items():
            servers[name] = launch_server(tmp_path_factory.mktemp(name), *flags)
        yield servers
    finally:
        for server in servers.values():
            server.stop()
    for name, server in servers.items():  # nothing the tests did may have crashed a handler
        log = server.log()
        assert "Traceback" not in log, f"{name} logged an exception:\n{log}"


@pytest.fixture(scope="package")
def server(launched: dict[str, Server]) -> Server:
    """The default model served with the default options (fullTextEnabled off)."""
    launched["server"].wait_ready()
    return launched["server"]


@pytest.fixture(scope="module")
def full_text_server(launched: dict[str, Server]) -> Iterator[Server]:
    """A second server with ``--full-text`` (MindIE fullTextEnabled), stopped after its module."""
    server = launched["full_text_server"]
    server.wait_ready()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def llm(launched: dict[str, Server]) -> LLM:
    """The offline engine on the default model (loaded while the servers start)."""
    return LLM(
        max_model_len=2048,
        kv_cache_memory="128MiB",
        max_num_batched_tokens=256,
        dtype="float32",
        quantization="none",
    )


@pytest.fixture(scope="package")
def tokenizer(llm: LLM) -> Tokenizer:
    """The default model's tokenizer and chat template (the server's own, loaded offline)."""
    return llm.get_tokenizer()


@pytest.fixture(scope="package")
def oracle(llm: LLM, tokenizer: Tokenizer) -> Oracle:
    """Greedy outputs of the offline engine; the prompts most tests use run as one batch."""
    oracle = Oracle(llm)
    oracle.run(
        [
            (PROMPT, PROMPT_TOKENS),
            (CODE_PROMPT, PROMPT_TOKENS),
            (STORY, STORY_TOKENS),
            (QUESTION, QUESTION_TOKENS),
            (tokenizer.apply_chat_template(QUESTION), QUESTION_TOKENS),
        ]
    )
    return oracle


@pytest.fixture(scope="package")
def client(server: Server) -> Iterator[openai.OpenAI]:
    """The official OpenAI SDK pointed at ``server``."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        yield client
