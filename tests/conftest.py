"""Shared pytest set-up: the `cuda` and `npu` markers skip when that hardware is absent.

Without a GPU, Triton kernels (the CUDA platform's paged decode attention) run under Triton's
interpreter, so their tests run on the CPU too; Triton reads the switch when a kernel is
defined, hence here, before any test module imports one.
"""

import importlib.util
import os

import pytest


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "cuda" in item.keywords and not _has_cuda():
            item.add_marker(pytest.mark.skip(reason="no CUDA device"))
        if "npu" in item.keywords and importlib.util.find_spec("torch_npu") is None:
            item.add_marker(pytest.mark.skip(reason="no Ascend NPU (torch_npu absent)"))
