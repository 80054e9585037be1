"""PEFT LoRA adapters read from disk and checked against the base model they will run on.

An adapter directory holds ``adapter_config.json`` and ``adapter_model.safetensors`` (a pickled
``adapter_model.bin`` is refused: loading it would run code). Each adapted module ``m`` adds
``scale * B_m (A_m x)`` to the base projection, ``scale = lora_alpha / r`` (``/ sqrt(r)`` with
``use_rslora``), r and alpha per module where ``rank_pattern`` / ``alpha_pattern`` say so. The
scale is folded into B here, once, so the layers apply rows as given (as TensorRT-LLM's
``lora_weights`` rows are).

What changes the forward in a way the layers do not compute is refused, naming the field:
DoRA, LoRA biases, activated LoRA, QA-LoRA, routed/variational variants, extra trainable
modules or tokens, layer replication, and any target outside the decoder layers' q/k/v/o/
gate/up/down projections. Unknown keys are ignored (newer PEFT writes dozens). Every refusal is
a `LoRAError` naming the adapter and the tensor or field.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from ferrollm.lora.targets import SHARD_NAMES, Target, checkpoint_modules, lora_targets

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
#: ``base_model.model.model.layers.{i}.{module}.lora_{A|B}[.adapter name].weight``
_TENSOR_NAME = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(.+)\.lora_([AB])(?:\.[A-Za-z0-9_-]+)?\.weight$"
)
#: Config fields whose set value changes the forward: refused (value is "unset").
_REFUSED: dict[str, Any] = {
    "use_dora": False,
    "lora_bias": False,
    "use_qalora": False,
    "use_bdlora": None,
    "alora_invocation_tokens": None,
    "arrow_config": None,
    "kasa_config": None,
    "monteclora_config": None,
    "modules_to_save": None,
    "trainable_token_indices": None,
    "target_parameters": None,
    "layer_replication": None,
}


class LoRAError(ValueError):
    """An adapter that cannot run on this model; the message names the adapter and the tensor
    or ``adapter_config.json`` field."""


@dataclass(frozen=True)
class LoRAWeights:
    """One projection's low-rank pair at the base model's full sizes, float32:
    ``a [r, in]`` and ``b [out, r]`` with the scale folded in."""

    a: torch.Tensor
    b: torch.Tensor


@dataclass(frozen=True)
class LoRAAdapter:
    """A loaded adapter: ``weights[(layer index, module path, shard)]``, e.g.
    ``(0, "self_attn.qkv_proj", "k_proj")``; ``rank`` is its largest r."""

    name: str
    path: Path
    rank: int
    weights: Mapping[tuple[int, str, str], LoRAWeights]


def load_peft_adapter(name: str, path: Path, model: nn.Module, max_lora_rank: int) -> LoRAAdapter:
    """Read the PEFT adapter in directory ``path`` for ``model``; `LoRAError` if it does not fit."""
    config = _read_config(name, Path(path))
    _check_config(name, config, model)
    tensors = _read_tensors(name, Path(path))
    targets = lora_targets(model)
    routes = checkpoint_modules(model)
    pairs: dict[tuple[int, str], dict[str, tuple[str, torch.Tensor]]] = {}
    for tensor_name, tensor in tensors.items():
        match = _TENSOR_NAME.match(tensor_name)
        if match is None or match.group(2) not in routes:
            raise LoRAError(
                f"adapter `{name}`: tensor `{tensor_name}` targets a module ferrollm does not "
                f"adapt (only the decoder layers' {', '.join(sorted(routes))})"
            )
        layer, module, kind = int(match.group(1)), match.group(2), match.group(3)
        pairs.setdefault((layer, module), {})[kind] = (tensor_name, tensor)
    weights: dict[tuple[int, str, str], LoRAWeights] = {}
    rank = 0
    for (layer, module), pair in sorted(pairs.items()):
        ours, shards = routes[module]
        target = targets.get((layer, ours))
        if target is None:
            some = next(iter(pair.values()))[0]
            raise LoRAError(f"adapter `{name}`: `{some}`: the model has no layer {layer} {module}")
        r, alpha = _rank_alpha(config, f"model.layers.{layer}.{module}")
        a, b = _check_pair(name, pair, target, shards, r, max_lora_rank)
        scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        b = b * scale
        offset = 0
        for shard in shards:
            rows = target.shard(shard).num_rows
            weights[(layer, ours, shard)] = LoRAWeights(a, b[offset : offset + rows].contiguous())
            offset += rows
        rank = max(rank, r)
    if not weights:
        raise LoRAError(f"adapter `{name}`: `{WEIGHTS_FILE}` holds no LoRA tensors")
    return LoRAAdapter(name, Path(path), rank, weights)


def _read_config(name: str, path: Path) -> dict[str, Any]:
    file = path / CONFIG_FILE
    try:
        config = json.loads(file.read_text())
    except FileNotFoundError:
        raise LoRAError(f"adapter `{name}`: `{file}` does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LoRAError(f"adapter `{name}`: cannot read `{file}`: {err}") from None
    if not isinstance(config, dict):
        raise LoRAError(f"adapter `{name}`: `{CONFIG_FILE}` is not a JSON object")
    return config


def _check_config(name: str, config: dict[str, Any], model: nn.Module) -> None:
    """Refuse what the layers do not compute, naming the field."""
    where = f"adapter `{name}`: `{CONFIG_FILE}`"
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise LoRAError(
            f"{where} field `peft_type` is {peft_type!r}; only LORA adapters are served"
        )
    for field, unset in _REFUSED.items():
        value = config.get(field, unset)
        if value not in (unset, None, False, [], {}):
            raise LoRAError(f"{where} sets `{field}` ({value!r}), which ferrollm does not support")
    if config.get("bias", "none") != "none":
        raise LoRAError(f'{where} field `bias` is {config["bias"]!r}; only "none" is supported')
    r = config.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        raise LoRAError(f"{where} field `r` must be a positive integer; got {r!r}")
    alpha = config.get("lora_alpha", r)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise LoRAError(f"{where} field `lora_alpha` must be a number; got {alpha!r}")
    targets = config.get("target_modules")
    if isinstance(targets, list):
        allowed = set(SHARD_NAMES) | {m.rpartition(".")[2] for m in checkpoint_modules(model)}
        for target in targets:
            leaf = str(target).rpartition(".")[2]
            if leaf not in allowed:
                raise LoRAError(
                    f"{where} field `target_modules` names {target!r}; ferrollm adapts only "
                    f"{', '.join(sorted(allowed))}"
                )


def _read_tensors(name: str, path: Path) -> dict[str, torch.Tensor]:
    file = path / WEIGHTS_FILE
    if not file.is_file():
        pickled = path / "adapter_model.bin"
        if pickled.is_file():
            raise LoRAError(
                f"adapter `{name}`: only `{pickled}` was found; pickled weights are not loaded "
                f"(convert them to `{WEIGHTS_FILE}`)"
            )
        raise LoRAError(f"adapter `{name}`: `{file}` does not exist")
    try:
        with safe_open(str(file), framework="pt") as f:
            return {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as err:
        raise LoRAError(f"adapter `{name}`: cannot read `{file}`: {err}") from None


def _rank_alpha(config: dict[str, Any], module: str) -> tuple[int, float]:
    """A module's r and alpha, ``rank_pattern`` / ``alpha_pattern`` matched as PEFT does (the
    first key that matches a dotted suffix of the module's name)."""
    r = _pattern_value(config.get("rank_pattern") or {}, module, config["r"])
    alpha = _pattern_value(config.get("alpha_pattern") or {}, module, config.get("lora_alpha", r))
    return int(r), float(alpha)


def _pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _check_pair(
    name: str,
    pair: dict[str, tuple[str, torch.Tensor]],
    target: Target,
    shards: tuple[str, ...],
    r: int,
    max_lora_rank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B of one module as float32, after every check that names a tensor."""
    for kind in "AB":
        if kind not in pair:
            other = next(iter(pair.values()))[0]
            missing = other.replace(f".lora_{'B' if kind == 'A' else 'A'}", f".lora_{kind}")
            raise LoRAError(f"adapter `{name}`: `{missing}` is missing (`{other}` is there)")
    (a_name, a), (b_name, b) = pair["A"], pair["B"]
    module = " + ".join(shards)
    if r > max_lora_rank:
        raise LoRAError(
            f"adapter `{name}`: `{a_name}` has rank {r}, above `max_lora_rank` {max_lora_rank}"
        )
    out = sum(target.shard(s).num_rows for s in shards)
    for tensor_name, tensor, want in ((a_name, a, [r, target.in_features]), (b_name, b, [out, r])):
        if list(tensor.shape) != want:
            raise LoRAError(
                f"adapter `{name}`: `{tensor_name}` has shape {list(tensor.shape)}; the model's "
                f"{module} expects {want}"
            )
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise LoRAError(f"adapter `{name}`: `{tensor_name}` has non-finite or non-float values")
    return a.to(torch.float32).contiguous(), b.to(torch.float32)
