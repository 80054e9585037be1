"""The prompts a benchmark sends: seeded random word prompts, or a JSONL file of prompts.

A random prompt is a string of common English words (about one token each), drawn from a
generator keyed by (seed, stream, index): the same seed gives the same prompts, another seed
shares no prefix with them, and request ``index`` is the same whatever the number of prompts,
so a concurrency sweep can give each level its own indices (no prefix-cache hits across
levels unless the seed repeats).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Words of about one token each in common tokenizers; random prompts draw from them.
_WORDS = """
    river mountain quietly engine garden history science window orange market bridge teacher
    ocean winter music letter forest simple planet yellow doctor summer castle village memory
    silver number travel kitchen library morning animal journey paper mirror thunder candle
    harbor desert island pencil rocket violin meadow lantern people water city country world
    family school story money night point house group problem fact month lot right study book
    eye job word business issue side kind head service friend father power hour game line end
    member law car name president team minute idea kid body information back parent face
    others level office door health person art war party result change reason research girl
    guy moment air force education foot boy age policy process music market sense nation plan
    college interest death experience effect class control care field development role effort
    rate heart drug show leader light voice wife police mind price report decision son view
    """
WORDS = tuple(_WORDS.split())
#: Streams of the generator: the measured requests, and the warm-up requests before them.
MEASURED, WARMUP = 0, 1


@dataclass(frozen=True)
class SampleRequest:
    """One prompt to send: its text, the output tokens to ask for, and its length in words
    (the input length when the server reports none)."""

    prompt: str
    output_len: int
    prompt_len: int


def random_requests(
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    seed: int = 0,
    first_index: int = 0,
    stream: int = MEASURED,
) -> list[SampleRequest]:
    """``num_prompts`` prompts of about ``input_len`` words asking ``output_len`` tokens, each
    length drawn uniformly from [len * (1 - range_ratio), len * (1 + range_ratio)]."""
    return [
        _random_request(input_len, output_len, range_ratio, (seed, stream, first_index + i))
        for i in range(num_prompts)
    ]


def _random_request(
    input_len: int, output_len: int, range_ratio: float, key: tuple[int, int, int]
) -> SampleRequest:
    rng = np.random.default_rng(key)
    num_words = _draw_len(rng, input_len, range_ratio)
    words = rng.choice(len(WORDS), size=num_words)
    # The index first: no two prompts of a run share more than a word of prefix.
    prompt = f"{key[2]} " + " ".join(WORDS[w] for w in words)
    return SampleRequest(prompt, _draw_len(rng, output_len, range_ratio), num_words + 1)


def _draw_len(rng: np.random.Generator, length: int, range_ratio: float) -> int:
    low = max(1, int(length * (1 - range_ratio)))
    high = max(low, int(length * (1 + range_ratio)))
    return int(rng.integers(low, high + 1))


class DatasetError(ValueError):
    """A dataset file that cannot be read as prompts; the message names the file and line."""


def jsonl_requests(path: Path, num_prompts: int, output_len: int) -> list[SampleRequest]:
    """The first ``num_prompts`` lines of a JSONL file of ``{"prompt": str, "output_len": int}``
    objects (``output_len`` optional: ``output_len`` then); fewer if the file has fewer."""
    requests: list[SampleRequest] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if len(requests) == num_prompts:
                break
            if line.strip():
                requests.append(_jsonl_request(line, output_len, f"{path}:{number}"))
    if not requests:
        raise DatasetError(f"{path}: no prompts")
    return requests


def _jsonl_request(line: str, output_len: int, where: str) -> SampleRequest:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{where}: not JSON ({e})") from None
    if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
        raise DatasetError(f'{where}: expected an object with a string "prompt"')
    out = item.get("output_len", output_len)
    if not isinstance(out, int) or isinstance(out, bool) or out < 1:
        raise DatasetError(f'{where}: "output_len" must be a positive integer; got {out!r}')
    return SampleRequest(item["prompt"], out, len(item["prompt"].split()))
