"""The LoRA options of `EngineConfig`, in vLLM's words, and their checks (torch-free).

``enable_lora`` turns adapters on; ``lora_modules`` names the PEFT directories loaded at start,
each ``"name=path"`` (the CLI's ``--lora-modules a=/x b=/y``), a JSON object
``{"name": ..., "path": ..., "base_model_name": ...}`` (vLLM's JSON form, as a string or a
mapping); ``max_loras`` adapters run at once (the scheduler holds back a request on another
adapter until one of them has no request running), ``max_cpu_loras`` adapters no request uses
stay loaded (least recently used evicted; None = ``max_loras``), ``max_lora_rank`` is the
largest rank an adapter may have (it sizes the slots every layer keeps). Adapters run under
tensor parallelism too (the workers read them from their directories).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from ferrollm.options import EngineConfigError, positive_int

#: vLLM's default rank cap is 16; the issue's (and this server's) is 64.
DEFAULT_MAX_LORA_RANK = 64


class LoRAModule(NamedTuple):
    """An adapter to load at start: its name (the request's ``model``), its PEFT directory, and
    the base model it was trained on (shown as ``parent`` by ``/v1/models``; None = served)."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(value: Any) -> LoRAModule:
    """One ``lora_modules`` entry: ``"name=path"``, a JSON object string, a mapping, or a
    (name, path[, base_model_name]) sequence. Raises EngineConfigError naming the option."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise _bad(value, f"not valid JSON ({e.msg})") from None
    if isinstance(value, str):
        name, sep, path = value.partition("=")
        if not sep:
            raise _bad(value, "expected name=path")
        return _checked(LoRAModule(name.strip(), path.strip()))
    if isinstance(value, Mapping):
        unknown = set(value) - {"name", "path", "base_model_name"}
        if unknown or not {"name", "path"} <= set(value):
            raise _bad(value, 'expected {"name": ..., "path": ..., "base_model_name": ...}')
        base = value.get("base_model_name")
        return _checked(LoRAModule(value["name"], value["path"], base))
    if isinstance(value, (list, tuple)) and len(value) in (2, 3):
        return _checked(LoRAModule(*value))
    raise _bad(value, "expected name=path or a JSON object")


class _Options(Protocol):
    """The `EngineConfig` fields the LoRA options are checked with."""

    @property
    def enable_lora(self) -> bool: ...
    @property
    def lora_modules(self) -> Any: ...
    @property
    def max_loras(self) -> int: ...
    @property
    def max_cpu_loras(self) -> int | None: ...
    @property
    def max_lora_rank(self) -> int: ...
    @property
    def task(self) -> str: ...
    @property
    def tensor_parallel_size(self) -> int: ...


def check_lora_options(config: _Options) -> tuple[LoRAModule, ...]:
    """The normalized ``lora_modules``; EngineConfigError naming the option that breaks a rule
    (LoRA options without ``enable_lora``, a repeated name, what adapters cannot run with)."""
    if not isinstance(config.enable_lora, bool):
        raise EngineConfigError(
            "enable_lora", f"`enable_lora` must be true or false; got {config.enable_lora!r}"
        )
    modules = tuple(parse_lora_module(m) for m in config.lora_modules or ())
    for name in ("max_loras", "max_lora_rank"):
        positive_int(name, getattr(config, name))
    if config.max_cpu_loras is not None:
        positive_int("max_cpu_loras", config.max_cpu_loras)
        if config.max_cpu_loras < config.max_loras:
            raise EngineConfigError(
                "max_cpu_loras",
                f"`max_cpu_loras` ({config.max_cpu_loras}) must be at least `max_loras` "
                f"({config.max_loras})",
            )
    names = [m.name for m in modules]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise EngineConfigError("lora_modules", f"`lora_modules` names {repeated[0]!r} twice")
    if not config.enable_lora:
        if modules:
            raise EngineConfigError("lora_modules", "`lora_modules` needs `enable_lora`")
        return modules
    if config.task == "embed":
        raise EngineConfigError(
            "task",
            "`enable_lora` cannot be used here: adapters run on generation (`task` generate)",
        )
    return modules


def _checked(module: LoRAModule) -> LoRAModule:
    if not isinstance(module.name, str) or not module.name:
        raise _bad(module, "the name must be a non-empty string")
    if not isinstance(module.path, str) or not module.path:
        raise _bad(module, "the path must be a non-empty string")
    if module.base_model_name is not None and not isinstance(module.base_model_name, str):
        raise _bad(module, "`base_model_name` must be a string")
    return module


def _bad(value: object, why: str) -> EngineConfigError:
    return EngineConfigError("lora_modules", f"`lora_modules` entry {value!r}: {why}")
