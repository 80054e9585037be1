"""`ferrollm serve` options: flags become engine and server config, checked before any
process starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ferrollm.cli import build_parser, serve_options
from ferrollm.config import EngineConfigError
from ferrollm.server_config import split_options


def options(*argv: str) -> dict[str, object]:
    return serve_options(build_parser().parse_args(["serve", *argv]))


def test_seed_and_flags_reach_the_engine_config(tmp_path: Path) -> None:
    config_file = tmp_path / "serve.json"
    config_file.write_text(json.dumps({"seed": 3, "max-num-seqs": 8, "port": 9001}))
    got = options("--config", str(config_file), "--seed", "7")
    engine, server = split_options(got)
    assert (engine.seed, engine.max_num_seqs, server.port) == (7, 8, 9001)
    assert split_options(options("--config", str(config_file)))[0].seed == 3


def test_a_bad_seed_is_refused_by_name() -> None:
    with pytest.raises(EngineConfigError, match="seed"):
        options("--seed", "-1")


def test_tensor_parallel_flags_reach_the_engine_config() -> None:
    engine, _ = split_options(
        options("--tensor-parallel-size", "2", "--distributed-timeout", "7.5")
    )
    assert (engine.tensor_parallel_size, engine.distributed_timeout) == (2, 7.5)
    with pytest.raises(EngineConfigError, match="tensor_parallel_size"):
        options("--tensor-parallel-size", "0")
    with pytest.raises(EngineConfigError, match=r"tensor_parallel_size.*task"):
        options("--tensor-parallel-size", "2", "--task", "embed")


def test_the_encoder_budget_flag_reaches_the_engine_config() -> None:
    engine, _ = split_options(options("--max-num-encoder-tokens", "512"))
    assert engine.max_num_encoder_tokens == 512
    assert split_options(options())[0].max_num_encoder_tokens is None  # the scheduler's default
    with pytest.raises(EngineConfigError, match="max_num_encoder_tokens"):
        options("--max-num-encoder-tokens", "0")
    with pytest.raises(EngineConfigError, match=r"max_num_encoder_tokens.*embed"):
        options("--max-num-encoder-tokens", "512", "--task", "embed")


def test_load_format_reaches_the_engine_config(tmp_path: Path) -> None:
    engine, _ = split_options(options(str(tmp_path), "--load-format", "dummy"))
    assert (engine.model, engine.load_format) == (str(tmp_path), "dummy")
    assert split_options(options())[0].load_format == "auto"
    with pytest.raises(EngineConfigError, match="load_format") as e:
        options(str(tmp_path), "--load-format", "random")
    assert e.value.field == "load_format"


def test_media_flags_reach_the_server_config(tmp_path: Path) -> None:
    _, server = split_options(
        options(
            "--allowed-local-media-path", str(tmp_path),
            "--allowed-media-domains", "images.example.com,127.0.0.1",
        )
    )  # fmt: skip
    assert server.allowed_local_media_path == str(tmp_path)
    assert server.allowed_media_domains == ("127.0.0.1", "images.example.com")
    assert server.media_policy().allowed_local_media_path == tmp_path.resolve()
    assert split_options(options())[1].media_policy().allowed_local_media_path is None


def test_a_bad_media_root_is_refused_naming_the_flag(tmp_path: Path) -> None:
    for root in ("relative/dir", str(tmp_path / "missing")):
        with pytest.raises(EngineConfigError, match="--allowed-local-media-path") as e:
            options("--allowed-local-media-path", root)
        assert e.value.field == "allowed_local_media_path"
    with pytest.raises(EngineConfigError, match="--allowed-media-domains"):
        options("--allowed-media-domains", "http://x.example/")


def test_no_playground_turns_the_playground_off(tmp_path: Path) -> None:
    assert split_options(options())[1].playground is True
    assert split_options(options("--no-playground"))[1].playground is False
    config_file = tmp_path / "serve.json"
    config_file.write_text(json.dumps({"playground": False}))
    assert split_options(options("--config", str(config_file)))[1].playground is False
    with pytest.raises(EngineConfigError, match="playground"):
        split_options({"playground": "no"})


def test_make_smolvlm_demo_takes_a_directory_and_a_seed(tmp_path: Path) -> None:
    args = build_parser().parse_args(["make-smolvlm-demo", str(tmp_path / "demo"), "--seed", "3"])
    assert (args.command, args.out_dir, args.seed, args.gguf) == (
        "make-smolvlm-demo",
        tmp_path / "demo",
        3,
        None,
    )
