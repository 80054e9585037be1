"""Schemathesis against ``/openapi.json`` on a real ``ferrollm serve`` process.

Schemathesis generates bodies and path parameters from the server's own OpenAPI document
(valid ones and broken ones) and sends them over HTTP; every response must be no 5xx, carry a
status, content type and headers the document lists, and a body that conforms to the schema the
document gives for it. Afterwards the server must still be ready and serve a request, and its
log must hold no traceback.

The bounded run here sends ``FERROLLM_FUZZ_HTTP_EXAMPLES`` cases per operation and phase
(default 50: under a minute on 2 cores); ``make fuzz-http`` raises it. The server runs with a
non-strict model name (any ``model`` and path ``{model}``/``{name}`` is the served one), so that
generated bodies reach validation and the engine instead of stopping at a 404, and with
``--max-iter-times 8`` so that no generated request decodes for long.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .e2e_support import MODEL, Server, launch_server

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
)
#: Cases per operation and phase; the seed makes a failure reproduce.
EXAMPLES = int(os.environ.get("FERROLLM_FUZZ_HTTP_EXAMPLES", "50"))
SEED = int(os.environ.get("FERROLLM_FUZZ_HTTP_SEED", "16"))
#: Wall-clock bound of the run (seconds): it must finish, not hang on a stuck request.
RUN_TIMEOUT_S = max(600, EXAMPLES * 10)


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("schemathesis")
    config = folder / "options.json"
    config.write_text(json.dumps({"strict_model_name": False}))
    server = launch_server(folder, "--config", str(config), "--max-iter-times", "8")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_schemathesis_finds_no_5xx_and_no_response_off_its_schema(
    fuzzed_server: Server, tmp_path: Path
) -> None:
    (tmp_path / "schemathesis.toml").write_text(
        f'[parameters]\nmodel = "{MODEL}"\nname = "{MODEL}"\nversion = "1"\n'
    )
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{fuzzed_server.url}/openapi.json",
        "--checks", ",".join(CHECKS),
        "--max-examples", str(EXAMPLES),
        "--seed", str(SEED),
        "--workers", "1",
        "--request-timeout", "120",
        "--phases", "examples,coverage,fuzzing",
        "--generation-database", "none",
        "--no-color",
    ]  # fmt: skip
    run = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"schemathesis failed ({run.returncode}):\n{output[-20_000:]}"
    assert "generated" in output and " passed" in output, output[-5_000:]

    # the server is healthy afterwards: ready, serving, and nothing crashed a handler
    assert fuzzed_server.http.get("/v2/health/ready").status_code == 200
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
    response = fuzzed_server.http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert fuzzed_server.metric("ferrollm_num_requests_running") == 0
    assert "Traceback" not in fuzzed_server.log(), fuzzed_server.log()[-20_000:]
