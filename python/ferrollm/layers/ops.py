"""The hot kernels as torch operators, for compiled graphs.

`torch.library.custom_op` wraps its function in several Python layers (autograd and
in-place-or-view kernels, an alias check of every output): ~20 us a call, and a decode step at
one row makes ~150 such calls. `cpu_op` defines the operator from its schema with a plain
Python kernel for the CPU dispatch key and a fake (meta) function for tracing, which the
dispatcher calls directly. The ops are for inference: no autograd formula is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_LIB = torch.library.Library("ferrollm", "FRAGMENT")  # type: ignore[no-untyped-call]


def cpu_op(schema: str, kernel: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """``ferrollm::<schema>`` run by ``kernel`` on the CPU, traced through ``fake``; its
    default overload, callable like ``kernel``."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)  # type: ignore[no-untyped-call]
    _LIB.impl(name, kernel, "CPU")  # type: ignore[no-untyped-call]
    torch.library.register_fake(f"ferrollm::{name}", fake, lib=_LIB)
    return getattr(torch.ops.ferrollm, name).default
