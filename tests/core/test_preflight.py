"""`ferrollm serve` refuses a model or setting it cannot serve before any port is bound: one
line naming the file or setting and the rule, exit status 2, no traceback, and no torch in the
parent process (Granian's main process keeps whatever it imported for the server's life)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ferrollm.default_model import default_model_path


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # Port 1 is never free to a test: had anything reached Granian, it would fail loudly.
    command = [sys.executable, "-m", "ferrollm", "serve", *args, "--port", "1"]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def _truncated(tmp_path: Path) -> Path:
    whole = default_model_path().read_bytes()
    path = tmp_path / "truncated.gguf"
    path.write_bytes(whole[: len(whole) // 2])  # the header is whole, the tensors are not
    return path


def _unsupported(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"]}))
    return tmp_path


def _no_tokenizer(tmp_path: Path) -> Path:
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: (p / "notes.gguf", (p / "notes.gguf").write_text("my notes"))[0],
         "is not a GGUF file (bad magic)"),
        (_truncated, "is truncated: tensor"),
        (_unsupported, "architecture 'FooForCausalLM' is not supported; supported: "),
        (_no_tokenizer, "tokenizer"),
    ],
    ids=["text-file", "truncated", "unsupported-architecture", "no-tokenizer"],
)  # fmt: skip
def test_a_model_that_cannot_be_served_is_one_line_and_exit_2(
    tmp_path: Path, make: object, says: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    result = serve(str(path))
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0] and says in lines[0], lines[0]
    assert "Traceback" not in result.stderr and "Listening" not in result.stdout + result.stderr


def test_the_traceback_comes_with_the_debug_log_level(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("my notes")
    result = serve(str(path), "--log-level", "debug")
    assert result.returncode == 2 and "Traceback" in result.stderr, result.stderr


def test_an_unknown_cpu_cap_is_refused_naming_the_variable() -> None:
    result = serve(env={"FERROLLM_CPU_ISA": "avx3"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        'ferrollm: error: `FERROLLM_CPU_ISA` must be one of native, avx2, baseline; got "avx3"'
    )


def test_the_check_opens_the_model_without_torch() -> None:
    code = (
        "import sys\n"
        "from ferrollm.config import EngineConfig\n"
        "from ferrollm.preflight import check_serving\n"
        "check_serving(EngineConfig())\n"
        "assert 'torch' not in sys.modules, 'the preflight imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
