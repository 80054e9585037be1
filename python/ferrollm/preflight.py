"""What `ferrollm serve` checks before Granian binds the port and starts its worker, without
torch: the CPU-feature cap parses, and the model to generate with opens (a GGUF file's header,
metadata and tokenizer, or a directory's config.json and tokenizer) and names an architecture
ferrollm runs. A failure is one line naming the file or setting and the rule (`PreflightError`),
instead of a traceback through the worker's lifespan after "Listening at".

An embedding model (``--task embed``) is only checked to exist here: its loader needs torch.
What can fail only once the model is on its device (memory, a dtype the device refuses) is
reported by the worker, in one line too (`ferrollm.server.app`).
"""

from __future__ import annotations

from pathlib import Path

from ferrollm import _core
from ferrollm.config import EngineConfig
from ferrollm.default_model import default_model_path
from ferrollm.executor.loader import load_model_source


class PreflightError(Exception):
    """A setting or model ``ferrollm serve`` cannot start with; the message says which."""


def check_serving(config: EngineConfig) -> None:
    """Raise PreflightError if ``config`` cannot be served (see the module docstring)."""
    try:
        _core.cpu_features()
    except ValueError as e:
        raise PreflightError(str(e)) from e
    if config.task != "generate":
        return
    try:
        path = Path(config.model) if config.model is not None else default_model_path()
        load_model_source(path, config.load_format)
    except (OSError, ValueError) as e:  # a missing file, a bad format, an unsupported model
        what = f"model {str(config.model)!r}" if config.model is not None else "the default model"
        raise PreflightError(f"{what} cannot be served: {e}") from e
