"""The ``server`` fixture: one tiny engine and its apps for the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_harness import Server

from tiny_models import build_tiny_model


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model_dir = build_tiny_model("llama3", tmp_path_factory.mktemp("server-model"))
    server = Server(model_dir)
    yield server
    server.close()
