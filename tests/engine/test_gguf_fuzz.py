"""Fuzzing the GGUF reader and the tokenizer metadata reader with corrupt files.

A small valid GGUF (a byte-level BPE tokenizer and two tensors) is mutated at random: bytes
flipped, runs overwritten with extreme integers, cut short, spliced. Every mutant must open
(and its tokenizer build) or fail with the reader's own error (`GGUFFormatError`,
`UnsupportedModelError`): never another exception, never a hang. ``FERROLLM_FUZZ_CASES`` raises
the count (``make fuzz``); the default run is seeded, so a failure reproduces.
"""

from __future__ import annotations

import os
import random
import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from ferrollm.executor.gguf_reader import GGUFFile, GGUFFormatError
from ferrollm.executor.gguf_tokenizer import build_tokenizer_json
from ferrollm.models.config import UnsupportedModelError

CASES = int(os.environ.get("FERROLLM_FUZZ_CASES", "400"))
#: Seconds one mutant may take (reading and building its tokenizer) before it counts as a hang.
CASE_LIMIT_S = 2.0
_EXTREMES = [0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1, 8, 9, 12, 13, 255]


def _valid_gguf(path: Path) -> bytes:
    writer = gguf.GGUFWriter(str(path), "llama")
    tokens = ["a", "b", "c", "ab", "abc", "<s>", "</s>", "Ġ", "Ġa"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 4) + [3, 3, 1, 1])
    writer.add_token_merges(["a b", "ab c", "Ġ a"])
    writer.add_bos_token_id(5)
    writer.add_eos_token_id(6)
    writer.add_uint32("general.alignment", 32)
    writer.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("h", np.ones(8, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def _mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(5)
        at = rng.randrange(len(out)) if out else 0
        if kind == 0:  # flip bytes
            for i in range(at, min(len(out), at + rng.randint(1, 4))):
                out[i] = rng.randrange(256)
        elif kind == 1:  # an extreme count, length, type or offset where a field may be
            value = rng.choice(_EXTREMES)
            fmt = rng.choice(["<Q", "<I"])
            if value < 2 ** (8 * struct.calcsize(fmt)):
                out[at : at + struct.calcsize(fmt)] = struct.pack(fmt, value)
        elif kind == 2:  # cut short
            del out[at:]
        elif kind == 3:  # splice a run from elsewhere
            src = rng.randrange(len(data))
            out[at:at] = data[src : src + rng.randint(1, 64)]
        else:  # drop a run
            del out[at : at + rng.randint(1, 64)]
    return bytes(out)


def _read(path: Path) -> str:
    """Open the file, read every tensor, build its tokenizer; what failed (or "ok")."""
    try:
        file = GGUFFile(path)
        for tensor in file.tensors:
            file.data(tensor)
    except GGUFFormatError:
        return "format"
    try:
        build_tokenizer_json(file.metadata)
    except UnsupportedModelError:
        return "tokenizer"
    return "ok"


def test_the_valid_file_reads(tmp_path: Path) -> None:
    path = tmp_path / "valid.gguf"
    _valid_gguf(path)
    assert _read(path) == "ok"
    file = GGUFFile(path)
    assert file.data(file.tensors[0]).tolist() == np.arange(12).reshape(3, 4).tolist()


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("empty", b""),
        ("magic only", b"GGUF"),
        ("bad magic", b"GGML" + bytes(20)),
        ("version 1", b"GGUF" + struct.pack("<IQQ", 1, 0, 0)),
        ("huge counts", b"GGUF" + struct.pack("<IQQ", 3, 2**63, 2**63)),
        ("alignment 0", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 17)
         + b"general.alignment" + struct.pack("<II", 4, 0)),
    ],
)  # fmt: skip
def test_corrupt_headers_raise_the_readers_own_error(
    tmp_path: Path, name: str, data: bytes
) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFFormatError, match=r"bad\.gguf"):
        GGUFFile(path)


def test_malformed_tokenizer_metadata_raises_unsupported_model_error() -> None:
    for meta in [
        {"tokenizer.ggml.model": "gpt2"},  # no tokens
        {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": 5},
        {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"],
         "tokenizer.ggml.scores": 1},
        {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"],
         "tokenizer.ggml.merges": ["a"], "tokenizer.ggml.bos_token_id": "x"},
        {"tokenizer.ggml.model": 7},
    ]:  # fmt: skip
        with pytest.raises(UnsupportedModelError):
            build_tokenizer_json(meta)


def test_random_mutants_open_or_raise_the_readers_own_error(tmp_path: Path) -> None:
    valid = _valid_gguf(tmp_path / "valid.gguf")
    rng = random.Random(16)
    path = tmp_path / "mutant.gguf"
    outcomes: dict[str, int] = {}
    for case in range(CASES):
        mutant = _mutate(rng, valid)
        path.write_bytes(mutant)
        started = time.monotonic()
        try:
            outcome = _read(path)
        except Exception as e:  # pragma: no cover - the failure this test looks for
            raise AssertionError(f"case {case}: {type(e).__name__}: {e}; bytes {mutant!r}") from e
        assert time.monotonic() - started < CASE_LIMIT_S, f"case {case} hung: {mutant!r}"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(f"gguf fuzz: {CASES} mutants: {outcomes}")
    assert outcomes.get("format", 0) > CASES // 10  # the mutations do reach the reader
