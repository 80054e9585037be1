"""The MLP activations the supported families use, by their config.json names."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import MappingProxyType

import torch
import torch.nn.functional as F

#: ``hidden_act`` / ``hidden_activation`` -> the function (transformers' ``ACT2FN`` meanings).
ACTIVATIONS: MappingProxyType[str, Callable[[torch.Tensor], torch.Tensor]] = MappingProxyType(
    {
        "silu": F.silu,
        "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
        "gelu": F.gelu,
    }
)
