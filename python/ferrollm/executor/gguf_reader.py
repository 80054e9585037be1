"""A small GGUF parser: metadata as Python values, tensors as memory-mapped numpy views.

``gguf.GGUFReader`` builds a numpy view per metadata element, which takes seconds for a 49k-token
vocabulary; the default model is opened on every start, so we parse the header ourselves (one
pass with ``struct``) and leave only dequantization to the ``gguf`` package. Tensor views are laid
out exactly as ``GGUFReader`` lays them out, so ``gguf.quants.dequantize`` sees the same input.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
#: GGUF metadata value type -> struct format (strings and arrays are handled apart).
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
#: ggml tensor type -> numpy dtype for the unquantized ones (F32, F16, F64, I8..I64).
_PLAIN_TENSORS = {
    0: np.float32,
    1: np.float16,
    28: np.float64,
    24: np.int8,
    25: np.int16,
    26: np.int32,
    27: np.int64,
}


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader can read: truncated, corrupt or out of range.
    The message names the file and what was wrong."""


#: What a corrupt header makes ``struct``, ``numpy`` and ``bytes.decode`` raise.
_CORRUPT = (struct.error, UnicodeDecodeError, ValueError, OverflowError, TypeError, MemoryError)


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor's header: ``shape`` in numpy (row-major) order, data as stored."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # absolute, in bytes from the start of the file


class GGUFFile:
    """A memory-mapped GGUF file: parsed ``metadata`` and ``tensors``; data read on demand."""

    def __init__(self, path: str | Path) -> None:
        self._path = str(path)
        with open(path, "rb") as f:
            try:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file cannot be mapped
                raise GGUFFormatError(f"{self._path!r} is not a GGUF file (empty)") from None
        self._pos = 0
        if self._map[:4] != _MAGIC:
            raise GGUFFormatError(f"{self._path!r} is not a GGUF file (bad magic)")
        try:
            self._parse()
        except GGUFFormatError:
            raise
        except _CORRUPT as e:
            raise GGUFFormatError(
                f"{self._path!r}: corrupt GGUF header at byte {self._pos}: {e}"
            ) from None

    def _parse(self) -> None:
        self._pos = 4
        version = self._scalar("<I")
        if version not in (2, 3):
            raise GGUFFormatError(
                f"{self._path!r}: GGUF version {version} is not supported (2 or 3)"
            )
        num_tensors, num_kv = self._scalar("<Q"), self._scalar("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(num_kv):
            key = self._string()
            self.metadata[key] = self._value(self._scalar("<I"))
        infos = [self._tensor_info() for _ in range(num_tensors)]
        alignment = self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if type(alignment) is not int or not 0 < alignment <= 1 << 20:
            raise GGUFFormatError(
                f"{self._path!r}: general.alignment must be an integer in [1, 2^20]; "
                f"got {alignment!r}"
            )
        data_start = -(-self._pos // alignment) * alignment
        self.tensors = [
            GGUFTensor(name, shape, ggml_type, data_start + offset)
            for name, shape, ggml_type, offset in infos
        ]
        for tensor in self.tensors:  # a truncated file fails here, not halfway through loading
            end = tensor.offset + self._num_bytes(tensor)
            if end > len(self._map):
                raise GGUFFormatError(
                    f"{self._path!r} is truncated: tensor {tensor.name!r} ends at byte {end} "
                    f"but the file has {len(self._map)} bytes"
                )

    @staticmethod
    def _num_bytes(tensor: GGUFTensor) -> int:
        count = int(np.prod(tensor.shape))
        plain = _PLAIN_TENSORS.get(tensor.ggml_type)
        if plain is not None:
            return count * np.dtype(plain).itemsize
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.ggml_type)]
        return count // block_size * type_size

    def data(self, tensor: GGUFTensor) -> np.ndarray[Any, Any]:
        """A read-only view of ``tensor``'s bytes, shaped as ``gguf.quants.dequantize`` wants;
        GGUFFormatError when the file does not hold them."""
        try:
            return self._data(tensor)
        except _CORRUPT as e:
            raise GGUFFormatError(
                f"{self._path!r}: tensor {tensor.name!r} (type {tensor.ggml_type}, shape "
                f"{tensor.shape}) is not readable: {e}"
            ) from None

    def _data(self, tensor: GGUFTensor) -> np.ndarray[Any, Any]:
        plain = _PLAIN_TENSORS.get(tensor.ggml_type)
        if plain is not None:
            count = int(np.prod(tensor.shape))
            flat = np.frombuffer(self._map, plain, count=count, offset=tensor.offset)
            return flat.reshape(tensor.shape)
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.ggml_type)]
        *rows, row_length = tensor.shape
        byte_shape = (*rows, row_length // block_size * type_size)
        count = int(np.prod(byte_shape))
        flat = np.frombuffer(self._map, np.uint8, count=count, offset=tensor.offset)
        return flat.reshape(byte_shape)

    def _take(self, size: int) -> bytes:
        chunk = self._map[self._pos : self._pos + size]
        if len(chunk) != size:
            raise GGUFFormatError(f"{self._path!r}: truncated GGUF file at byte {self._pos}")
        self._pos += size
        return chunk

    def _scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        return self._take(self._scalar("<Q")).decode("utf-8")

    def _value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self._string()
        if value_type == _ARRAY:
            item_type, count = self._scalar("<I"), self._scalar("<Q")
            if item_type in _SCALARS:  # one vectorised read instead of `count` unpacks
                dtype = np.dtype(_SCALARS[item_type])
                items = np.frombuffer(self._map, dtype, count=count, offset=self._pos)
                self._pos += dtype.itemsize * count
                return items.tolist()
            return [self._value(item_type) for _ in range(count)]
        if value_type in _SCALARS:
            return self._scalar(_SCALARS[value_type])
        raise GGUFFormatError(
            f"{self._path!r}: unknown GGUF metadata value type {value_type} at byte {self._pos}"
        )

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        num_dims = self._scalar("<I")
        dims = [self._scalar("<Q") for _ in range(num_dims)]
        ggml_type, offset = self._scalar("<I"), self._scalar("<Q")
        return name, tuple(reversed(dims)), ggml_type, offset
