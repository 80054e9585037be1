"""The device names ferrollm knows, in the order ``ferrollm.platforms`` detects them.

A module of its own, importing nothing, so that ``ferrollm.config`` (which checks the ``device``
option and must not import torch) and ``ferrollm.platforms`` (which detects devices) both
depend on it instead of on each other.
"""

from __future__ import annotations

#: Device names, NPU first: an explicit ``device`` must be one of them.
DEVICE_NAMES = ("npu", "cuda", "cpu")
