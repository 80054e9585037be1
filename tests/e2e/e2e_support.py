"""What the end-to-end tests share: ``ferrollm serve`` processes, the offline oracle, SSE and
metrics readers, and the prompts several modules use.

`launch_server` runs ``<this python> -m ferrollm serve`` on a free port with the default model
(SmolLM2-135M-Instruct GGUF, no MODEL argument), so the server runs the same installation as the
tests (PYTHONPATH is inherited); `Server.wait_ready` polls ``/v2/health/ready`` (failing with the
server's log if it never comes). `Server.stop` sends SIGINT, then SIGTERM, then SIGKILL to the
server's process group until none of it is left, and runs at exit for any server a teardown
missed.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ferrollm import LLM, CompletionOutput, SamplingParams
from ferrollm.tokenizer import Tokenizer

#: The served name of the default model (the GGUF file's stem).
MODEL = "SmolLM2-135M-Instruct.Q4_1"

#: Flags of every test server: the brief's size limits, plus a small step budget so that the
#: start-up profiling pass stays cheap on a 2-core CI machine (prompts here are short). The
#: servers run the parity mode (float32, dense weights), like the offline oracle: its results
#: do not depend on how requests were batched together, which bfloat16 kernels do not promise.
SERVER_FLAGS = (
    "--dtype",
    "float32",
    "--quantization",
    "none",
    "--max-model-len",
    "2048",
    "--kv-cache-memory",
    "512MiB",
    "--max-num-batched-tokens",
    "256",
)

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0

# Prompts shared by several modules, with the token budgets they are always asked with, so that
# the oracle computes each once (`COMMON`).
#: A raw prompt whose greedy continuation runs past 16 tokens.
PROMPT = "Once upon a time, in a small village by the sea,"
PROMPT_TOKENS = 12
#: Another raw prompt (a batch of two, with PROMPT), asked with PROMPT_TOKENS too.
CODE_PROMPT = "def add(a, b):"
#: A chat whose greedy answer runs past 16 tokens.
STORY = [{"role": "user", "content": "Tell me a short story about a robot who learns to paint."}]
STORY_TOKENS = 16
#: A chat the model answers ("... Paris.") and ends with EOS, well before 32 tokens.
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
QUESTION_TOKENS = 32

_EXEC_WITH_PARENT_DEATH_SIGNAL = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass  # not Linux: the teardowns and the atexit hook must do
if os.getppid() != int(sys.argv[1]):
    sys.exit("the test process is gone")
os.execv(sys.argv[2], sys.argv[2:])
"""

#: Servers started and not yet stopped.
_live: list[Server] = []


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    """A ``ferrollm serve`` process, with an HTTP client on it."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.url, timeout=60.0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """``GET /metrics`` as {sample name: value}, for the series whose only label is
        ``model_name`` (the first sample of any other)."""
        response = self.http.get("/metrics")
        response.raise_for_status()
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                samples.setdefault(sample.name, sample.value)
        return samples

    def metric(self, name: str) -> float:
        return self.metrics()[name]

    def wait_ready(self) -> None:
        """Poll ``/v2/health/ready`` until it answers 200; on failure (the server exits, or
        READY_TIMEOUT_S pass) stop it and fail with its log."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        last = "no answer"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                pytest.fail(
                    f"the server exited with {self.process.returncode} before it was ready; "
                    f"its log:\n{self.log()}"
                )
            try:
                response = self.http.get("/v2/health/ready", timeout=2.0)
                if response.status_code == 200:
                    return
                last = f"{response.status_code} {response.text}"
            except httpx.TransportError as e:
                last = repr(e)
            time.sleep(0.1)
        self.stop()
        pytest.fail(
            f"the server was not ready after {READY_TIMEOUT_S:.0f} s (last: {last}); "
            f"its log:\n{self.log()}"
        )

    def stop(self) -> None:
        """SIGINT (Granian shuts its worker down), then SIGTERM, then SIGKILL, until no process
        of the server's group is left. Idempotent."""
        self.http.close()
        if self not in _live:
            return
        _live.remove(self)
        pgid = self.process.pid  # start_new_session: the group is the server's own
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                if self.process.poll() is None:
                    os.kill(self.process.pid, sig)
                else:  # the main process is gone but a worker is not
                    os.killpg(pgid, sig)
            if self._wait_stopped(pgid, STOP_TIMEOUT_S):
                return
        raise RuntimeError(f"server process group {pgid} survived SIGKILL: {_group(pgid)}")

    def _wait_stopped(self, pgid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self.process.poll()  # reaps the main process
            if self.process.returncode is not None and not _group(pgid):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def _group(pgid: int) -> list[int]:
    """The live (not zombie) processes of group ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp
                members.append(int(stat.parent.name))
    return members


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_live):
        server.stop()


def launch_server(log_dir: Path, *extra: str) -> Server:
    """Start ``python -m ferrollm serve`` on a free port; `Server.wait_ready` waits for it."""
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    command = [sys.executable, "-m", "ferrollm", "serve", "--port", str(port), *SERVER_FLAGS]
    # Through a stub that asks Linux to SIGTERM the server should the test process die without
    # its teardowns (killed, or SIGTERMed by a CI timeout), then execs exactly `command`.
    command = [sys.executable, "-c", _EXEC_WITH_PARENT_DEATH_SIGNAL, str(os.getpid()), *command]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*command, *extra],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() reaches the worker too
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    _live.append(server)
    return server


@contextlib.contextmanager
def serving(log_dir: Path, *extra: str) -> Iterator[Server]:
    """A server launched with ``extra`` arguments, ready; stopped at the end, when its log
    must hold no traceback (nothing the tests did may have crashed a handler)."""
    server = launch_server(log_dir, *extra)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
    assert "Traceback" not in server.log(), server.log()


Messages = list[dict[str, Any]]


class Oracle:
    """Greedy outputs of the offline engine, computed once per (prompt, max_tokens).

    A text prompt is encoded as ``LLM.generate`` and the servers' completion routes do; a chat
    as ``LLM.chat`` and the chat routes do (the template, then no special tokens added).
    """

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.tokenizer: Tokenizer = llm.get_tokenizer()
        self._cache: dict[tuple[str, int], CompletionOutput] = {}

    def complete(self, prompt: str, max_tokens: int) -> CompletionOutput:
        return self.run([(prompt, max_tokens)])[0]

    def chat(self, messages: Messages, max_tokens: int) -> CompletionOutput:
        return self.run([(messages, max_tokens)])[0]

    def run(self, requests: Sequence[tuple[str | Messages, int]]) -> list[CompletionOutput]:
        """Greedy outputs of several requests; those not seen yet run as one batch."""
        keys = [(json.dumps(prompt), max_tokens) for prompt, max_tokens in requests]
        missing = {
            key: request for key, request in zip(keys, requests, strict=True)
            if key not in self._cache
        }  # fmt: skip
        if missing:
            prompts = [self.encode(prompt) for prompt, _ in missing.values()]
            params = [SamplingParams(temperature=0, max_tokens=m) for _, m in missing.values()]
            for key, out in zip(missing, self.llm.generate(prompts, params), strict=True):
                self._cache[key] = out.outputs[0]
        return [self._cache[key] for key in keys]

    def encode(self, prompt: str | Messages) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return self.tokenizer.encode_chat(prompt)


def sse_payloads(raw: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body, checking the framing (docs/api/common.md#streaming):
    every event is exactly ``data: <one line>`` followed by a blank line, and nothing else is in the
    body."""
    text = raw.decode()
    assert text.endswith("\n\n"), f"the stream does not end with a blank line: {text[-80:]!r}"
    payloads = []
    for event in text[:-2].split("\n\n"):
        assert event.startswith("data: "), f"not a `data: ` event: {event[:80]!r}"
        payload = event.removeprefix("data: ")
        assert "\n" not in payload and "\r" not in payload, f"a multi-line event: {event!r}"
        payloads.append(payload)
    return payloads


@dataclass(frozen=True)
class SpanningStop:
    """A stop string that crosses a token boundary of a known greedy output."""

    stop: str
    #: The output text before the stop string (what the server must return).
    text_before: str
    #: Tokens generated up to and including the one that completes the stop string.
    num_tokens: int


def spanning_stop(tokenizer: Tokenizer, token_ids: list[int], min_before: int = 4) -> SpanningStop:
    """A 4-character stop string of the output ``token_ids``: its first two characters end
    token k-1, its last two start token k, and it occurs nowhere earlier in the text."""
    text = tokenizer.decode(token_ids)
    # ends[i]: the length of the text of tokens 0..i (prefixes decode to prefixes of the text).
    ends = [len(tokenizer.decode(token_ids[: i + 1])) for i in range(len(token_ids))]
    for k in range(1, len(token_ids)):
        boundary = ends[k - 1]
        start = boundary - 2
        token_start = ends[k - 2] if k >= 2 else 0
        if start < max(min_before, token_start) or boundary + 2 > ends[k]:
            continue
        stop = text[start : boundary + 2]
        assert text.startswith(tokenizer.decode(token_ids[:k]))
        if text.find(stop) == start and stop.strip() == stop:
            return SpanningStop(stop, text[:start], k + 1)
    raise AssertionError(f"no stop string crosses a token boundary of {text!r}")


def data_uri(data: bytes, mime: str) -> str:
    """``data`` as a base64 data URI of type ``mime``."""
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def media_part(part_type: str, url: str) -> dict[str, Any]:
    """An OpenAI chat content part of ``part_type`` (``image_url``, ``audio_url``, ...)."""
    return {"type": part_type, part_type: {"url": url}}


def media_chat(question: str, *parts: dict[str, Any]) -> list[Any]:
    """One user message: ``parts``, then ``question`` as text."""
    return [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]
