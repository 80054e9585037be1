"""Pillow and PyAV are imported only when media is decoded: the server and the scheduler run
without them, and a server that takes no media never needs them. The decoders import them
inside their functions and turn an ImportError into `missing`'s error."""

from __future__ import annotations

import importlib

from ferrollm.media.errors import MediaDependencyError


def missing(package: str) -> MediaDependencyError:
    """The error for a decoder whose library is not installed, naming the extra to install."""
    return MediaDependencyError(
        f"{package} is not installed; decoding media needs Pillow and PyAV: "
        "pip install 'ferrollm[media]'"
    )


def require_media_deps() -> None:
    """Raises MediaDependencyError unless both decoders import; for a server to call at
    start-up when it is configured to take media, so the first request does not find out."""
    for module, package in (("PIL.Image", "Pillow"), ("av", "PyAV")):
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise missing(package) from error
