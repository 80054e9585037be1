"""`MoeParams`: the mixture-of-experts fields of a Mixtral / Qwen2-MoE / Qwen3-MoE config.json.

Torch-free, read once by ``ModelConfig.from_hf_dict`` (``ModelConfig.moe``). The families differ
in names and defaults, which this module resolves so the model holds no per-family facts:

* Mixtral: experts of ``intermediate_size``, always renormalises its top-k weights, every
  layer sparse;
* Qwen2-MoE / Qwen3-MoE: experts of ``moe_intermediate_size``, renormalised only with
  ``norm_topk_prob``; the layers of ``mlp_only_layers``, and those not on the
  ``decoder_sparse_step`` grid, run a dense MLP of ``intermediate_size``; Qwen2-MoE adds a
  shared expert (``shared_expert_intermediate_size``) behind a sigmoid gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferrollm.models.config_fields import int_field

#: model_type -> whether the family has a shared expert.
MOE_MODEL_TYPES = {"mixtral": False, "qwen2_moe": True, "qwen3_moe": False}


@dataclass(frozen=True)
class MoeParams:
    """How a model's sparse MLP layers route and what their experts are."""

    num_experts: int
    #: experts each token is routed to (top-k of the router's softmax).
    num_experts_per_tok: int
    #: each expert's gate/up rows (and down columns).
    expert_intermediate_size: int
    #: divide the top-k weights by their sum (Mixtral always; Qwen with ``norm_topk_prob``).
    renormalize: bool
    #: the shared expert's size (Qwen2-MoE), 0 when there is none.
    shared_expert_intermediate_size: int
    #: layers that run the dense MLP of ``intermediate_size`` instead of experts.
    dense_layers: tuple[int, ...]


def moe_params(config: Mapping[str, Any], model_type: str, num_layers: int) -> MoeParams | None:
    """The MoE fields of a ``model_type`` config, or None for a dense family.

    Raises ValueError naming the field when one is missing or out of range.
    """
    if model_type not in MOE_MODEL_TYPES:
        return None
    mixtral = model_type == "mixtral"
    # transformers 5 writes Qwen3-MoE's count as `num_local_experts` (Mixtral's name); the
    # released checkpoints say `num_experts`.
    key = "num_experts" if config.get("num_experts") is not None else "num_local_experts"
    num_experts = int_field(config, key)
    top_k = int_field(config, "num_experts_per_tok")
    if top_k > num_experts:
        raise ValueError(
            f"config.json: `num_experts_per_tok` ({top_k}) must be at most `{key}` ({num_experts})"
        )
    shared = 0
    if MOE_MODEL_TYPES[model_type]:
        shared = int_field(config, "shared_expert_intermediate_size")
    return MoeParams(
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        expert_intermediate_size=int_field(
            config, "intermediate_size" if mixtral else "moe_intermediate_size"
        ),
        renormalize=mixtral or bool(config.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=shared,
        dense_layers=() if mixtral else _dense_layers(config, num_layers),
    )


def _dense_layers(config: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """Qwen's rule: a layer is sparse unless listed in ``mlp_only_layers`` or off the
    ``decoder_sparse_step`` grid (layer ``i`` is sparse when ``(i + 1) % step == 0``)."""
    step = int_field(config, "decoder_sparse_step", default=1)
    listed = config.get("mlp_only_layers") or []
    if not isinstance(listed, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers for i in listed
    ):
        raise ValueError(
            f"config.json: `mlp_only_layers` must list layer indices below {num_layers}; "
            f"got {listed!r}"
        )
    return tuple(i for i in range(num_layers) if i in listed or (i + 1) % step)
