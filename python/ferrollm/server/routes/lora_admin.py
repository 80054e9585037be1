"""vLLM's runtime adapter routes: ``POST /v1/load_lora_adapter`` ``{"lora_name",
"lora_path"}`` and ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``
(docs/lora.md#serving-adapters).

Both answer 404 unless the server runs with ``--allow-runtime-lora-updating``; they sit behind
the API key like every other route. A path is resolved (symlinks, ``..``) before it is
checked against ``--allowed-lora-path``; the adapter is read and checked on a worker thread,
and takes effect at once: the next request naming it runs on it. An unloaded adapter's
running requests finish on it (``ferrollm.lora.manager``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TypeVar

import msgspec

from ferrollm.lora.adapter import LoRAError
from ferrollm.lora.manager import LoRAManager
from ferrollm.server.context import ServerContext
from ferrollm.server.errors import ApiError, bad_request
from ferrollm.server.http import JSONResponse, Request, Response


class LoadLoRAAdapter(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/load_lora_adapter``."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapter(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/unload_lora_adapter`` (vLLM's ``lora_int_id`` is accepted and not needed:
    the name identifies the adapter)."""

    lora_name: str
    lora_int_id: int | None = None


async def load_lora_adapter(ctx: ServerContext, request: Request) -> Response:
    """Read the adapter at ``lora_path`` as ``lora_name``."""
    manager = _manager(ctx)
    body = _decode(request.body, LoadLoRAAdapter)
    name = _name(ctx, body.lora_name)
    if name in manager:
        raise bad_request(f"LoRA adapter {name!r} is already loaded", "lora_name")
    path = _confined(ctx, body.lora_path)
    try:
        await asyncio.to_thread(manager.add, name, path)
    except LoRAError as e:
        raise bad_request(str(e), "lora_path") from None
    return _text(f"Success: LoRA adapter {name!r} added successfully.")


async def unload_lora_adapter(ctx: ServerContext, request: Request) -> Response:
    """Forget ``lora_name``; requests already running on it finish on it."""
    manager = _manager(ctx)
    body = _decode(request.body, UnloadLoRAAdapter)
    if not manager.remove(body.lora_name):
        raise ApiError(
            404,
            f"LoRA adapter {body.lora_name!r} is not loaded",
            param="lora_name",
            code="model_not_found",
        )
    return _text(f"Success: LoRA adapter {body.lora_name!r} removed successfully.")


_Body = TypeVar("_Body", LoadLoRAAdapter, UnloadLoRAAdapter)
_TEXT = b"text/plain; charset=utf-8"


def _text(message: str) -> Response:
    return JSONResponse(message.encode(), content_type=_TEXT)


def _manager(ctx: ServerContext) -> LoRAManager:
    if not ctx.config.allow_runtime_lora_updating:
        raise ApiError(
            404,
            "runtime LoRA updates are off (start the server with --allow-runtime-lora-updating)",
            code="not_found",
        )
    manager = ctx.lora
    if manager is None:
        raise bad_request(
            "this server has no LoRA adapters (start it with --enable-lora)",
            code="unsupported",
        )
    return manager


def _decode(body: bytes, kind: type[_Body]) -> _Body:
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as e:
        field = str(e).rpartition("at `$.")[2].rstrip("`") or None
        raise bad_request(f"invalid body: {e}", field) from None
    except msgspec.DecodeError as e:
        raise bad_request(f"the body is not a JSON object: {e}") from None


def _name(ctx: ServerContext, name: str) -> str:
    if not name or name == ctx.model_name:
        raise bad_request(
            f"`lora_name` must be a non-empty name other than the served model's; got {name!r}",
            "lora_name",
        )
    return name


def _confined(ctx: ServerContext, raw: str) -> Path:
    """``raw`` resolved, if it is a directory under ``--allowed-lora-path``; else 400."""
    assert ctx.config.allowed_lora_path is not None  # required with runtime updates
    root = Path(ctx.config.allowed_lora_path).resolve()
    try:
        path = Path(raw).resolve(strict=True)
    except (OSError, RuntimeError):
        raise bad_request(f"`lora_path` {raw!r} does not exist", "lora_path") from None
    if not path.is_relative_to(root):
        raise bad_request(
            f"`lora_path` {raw!r} is outside the allowed adapter directory (--allowed-lora-path)",
            "lora_path",
        )
    if not path.is_dir():
        raise bad_request(f"`lora_path` {raw!r} is not a directory", "lora_path")
    return path
