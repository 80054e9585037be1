"""Shared pytest set-up: the `cuda` and `npu` markers skip when that hardware is absent, and
``--device`` picks the device the engine parity tests run on.

``--device cpu`` (the default) keeps every test on the CPU. ``--device cuda`` runs the tests
that take the ``device`` fixture (tests/engine: test_model_parity, test_default_model,
test_engine) on the GPU, our engine and the transformers oracle both; without a CUDA device it
is a usage error, never a quiet fall-back to the CPU.

Without a GPU, Triton kernels (the CUDA platform's paged decode attention) run under Triton's
interpreter, so their tests run on the CPU too; Triton reads the switch when a kernel is
defined, hence here, before any test module imports one.
"""

import importlib.util
import os
from pathlib import Path

import pytest

#: What ``--device`` accepts.
DEVICES = ("cpu", "cuda")


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="device of the engine parity tests (our engine and the transformers oracle): "
        "cpu (default) or cuda",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("device") == "cuda" and not _has_cuda():
        raise pytest.UsageError(
            "--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is "
            "False); run on a GPU machine, or leave --device out to test on the CPU"
        )


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> str:
    """The ``--device`` the parity tests run on: "cpu" or "cuda"."""
    value: str = pytestconfig.getoption("device")
    return value


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "cuda" in item.keywords and not _has_cuda():
            item.add_marker(pytest.mark.skip(reason="no CUDA device"))
        if "npu" in item.keywords and importlib.util.find_spec("torch_npu") is None:
            item.add_marker(pytest.mark.skip(reason="no Ascend NPU (torch_npu absent)"))


@pytest.fixture(scope="session")
def smolvlm_demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SmolVLM demo checkpoint (`ferrollm.multimodal.demo`, seed 0), built once per
    session from the default GGUF (a few seconds; 550 MB of float32 weights)."""
    from ferrollm.multimodal.demo import build_smolvlm_demo

    return build_smolvlm_demo(tmp_path_factory.mktemp("smolvlm-demo"))
