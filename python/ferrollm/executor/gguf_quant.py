"""GGUF's Q4_0, Q4_1 and Q8_0 blocks decoded into `GroupQuantized` tensors, with no float weight.

Each block covers 32 consecutive values of a row (ggml's ``block_q4_0``, ``block_q4_1``,
``block_q8_0``):

* Q4_0, 18 bytes: ``d`` (float16), 16 bytes of nibbles; ``x = d * (q - 8)``;
* Q4_1, 20 bytes: ``d``, ``m`` (float16), 16 bytes of nibbles; ``x = d * q + m``;
* Q8_0, 34 bytes: ``d`` (float16), 32 int8; ``x = d * q``.

Byte ``j`` of the nibbles holds value ``j`` in its low half and value ``j + 16`` in its high
half. The results equal ``gguf.dequantize`` exactly (tested).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ferrollm.layers.quant import GroupQuantized

#: ggml type ids (``GGMLQuantizationType``) decoded here.
Q4_0, Q4_1, Q8_0 = 2, 3, 8
BLOCK = 32
#: ggml type id -> its name, for log lines.
GGML_TYPE_NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0"}


def decode_blocks(data: np.ndarray[Any, Any], ggml_type: int) -> GroupQuantized:
    """``data``: a tensor's raw bytes ``[rows, blocks * block_bytes]`` (``GGUFFile.data``)."""
    rows = data.shape[0]
    if ggml_type == Q8_0:
        blocks = data.reshape(rows, -1, 34)
        d = _f16(blocks[..., 0:2])
        q = blocks[..., 2:].copy().view(np.int8).reshape(rows, -1)
        return GroupQuantized(torch.from_numpy(q), d, None, BLOCK, 8, "Q8_0")
    if ggml_type in (Q4_0, Q4_1):
        width = 18 if ggml_type == Q4_0 else 20
        blocks = data.reshape(rows, -1, width)
        d = _f16(blocks[..., 0:2])
        nibbles = blocks[..., width - 16 :]
        q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(rows, -1)
        zero = -8 * d if ggml_type == Q4_0 else _f16(blocks[..., 2:4])
        name = GGML_TYPE_NAMES[ggml_type]
        return GroupQuantized(torch.from_numpy(np.ascontiguousarray(q)), d, zero, BLOCK, 4, name)
    raise ValueError(f"ggml type {ggml_type} has no group-quantized decoding")


def _f16(two_bytes: np.ndarray[Any, Any]) -> torch.Tensor:
    """Little-endian float16 fields ``[..., 2]`` (uint8) -> float32 ``[...]``."""
    values = np.ascontiguousarray(two_bytes).view(np.float16)[..., 0]
    return torch.from_numpy(values.astype(np.float32))
