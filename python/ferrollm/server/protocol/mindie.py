"""MindIE ``/v2/models/{model}/generate`` and ``generate_stream`` bodies (docs/api/mindie.md)."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET, Struct, UnsetType


class GenerateParameters(Struct, kw_only=True):
    """``parameters`` (docs/api/mindie.md#request); ranges were checked by the Rust validator."""

    details: bool | None = None
    do_sample: bool | None = None
    max_new_tokens: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    batch_size: int | None = None
    typical_p: float | None = None
    watermark: bool | None = None
    perf_stat: bool | None = None
    priority: int | None = None
    timeout: int | None = None


class GenerateRequest(Struct, kw_only=True):
    """The body of both generate routes: ``text_input`` is a string or a list of parts."""

    text_input: str | list[dict[str, Any]]
    id: str | None = None
    parameters: GenerateParameters | None = None


class Details(Struct, kw_only=True):
    """``details``: ``finish_reason`` only on the last frame
    (docs/decisions.md#where-generate-puts-its-finish-reason); times in µs."""

    finish_reason: str | UnsetType = UNSET
    generated_tokens: int
    first_token_cost: None = None
    decode_cost: None = None
    batch_size: int
    queue_wait_time: int


class GenerateStreamFrame(Struct, kw_only=True):
    """One ``generate_stream`` event (docs/api/mindie.md#timing-fields): ``prefill_time`` (ms) on
    the first frame only, ``decode_time`` (ms) on the others; ``err_msg`` only when an error ended
    the request."""

    id: str
    model_name: str
    model_version: None = None
    text_output: str
    details: Details | UnsetType = UNSET
    prefill_time: float | None
    decode_time: float | None
    err_msg: str | UnsetType = UNSET


class GenerateResponse(Struct, kw_only=True):
    """The ``generate`` response (docs/api/mindie.md#generate-response): the whole text,
    per-decode-step times in ms."""

    id: str
    model_name: str
    model_version: None = None
    text_output: str
    details: Details
    prefill_time: float | None
    decode_time_arr: list[float]
