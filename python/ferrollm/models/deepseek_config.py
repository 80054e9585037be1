"""The DeepSeek-V2/V3 fields of a config.json: latent attention (`MlaParams`) and the router
and experts (`DeepseekMoeParams`).

Torch-free, read once by ``ModelConfig.from_hf_dict`` (``ModelConfig.mla``,
``ModelConfig.deepseek_moe``). The two versions differ in the router, which this module
resolves so the model holds no per-version facts:

* V2: softmax scores; ``topk_method`` "greedy" (top-k of all experts) or
  "group_limited_greedy" (the ``topk_group`` groups of highest max score, then the top-k in
  them); the top-k weights renormalised with ``norm_topk_prob`` (DeepSeek's own code; every
  released V2 says false, and transformers 5 never renormalises V2);
* V3: sigmoid scores plus ``e_score_correction_bias`` for choosing only ("noaux_tc"), a group
  scored by the sum of its top two; the weights are the uncorrected scores, renormalised with
  ``norm_topk_prob``.

Both scale the weights by ``routed_scaling_factor``, add ``n_shared_experts`` experts' worth
of an ungated shared MLP, and keep the first ``first_k_dense_replace`` layers dense.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferrollm.models.config_fields import UnsupportedModelError, float_field, int_field

DEEPSEEK_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")

#: model_type -> (scoring function, top-k methods it runs).
_ROUTERS = {
    "deepseek_v2": ("softmax", ("greedy", "group_limited_greedy")),
    "deepseek_v3": ("sigmoid", ("noaux_tc",)),
}


@dataclass(frozen=True)
class MlaParams:
    """Multi-head latent attention's sizes."""

    #: the compressed KV latent each token caches (before the rope part).
    kv_lora_rank: int
    #: the query's low-rank bottleneck, or None for a plain ``q_proj``.
    q_lora_rank: int | None
    qk_nope_head_dim: int
    #: the rotated part of each query head and of the one shared rotated key.
    qk_rope_head_dim: int
    v_head_dim: int
    #: rope turns adjacent pairs (V2 always; V3's ``rope_interleave``, default true).
    rope_interleave: bool

    @property
    def cache_head_dim(self) -> int:
        """Width of one token's cache row per layer: the latent, then the rotated key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class DeepseekMoeParams:
    """How DeepSeek's sparse layers route (module docstring)."""

    num_experts: int
    num_experts_per_tok: int
    expert_intermediate_size: int
    num_shared_experts: int
    #: "softmax" (V2) or "sigmoid" (V3).
    scoring_func: str
    #: "greedy", "group_limited_greedy" (V2) or "noaux_tc" (V3).
    topk_method: str
    num_groups: int
    topk_groups: int
    routed_scaling_factor: float
    renormalize: bool
    #: layers ``< first_k_dense_replace`` run the dense MLP.
    first_k_dense_replace: int


def mla_params(config: Mapping[str, Any], model_type: str) -> MlaParams | None:
    """The latent attention sizes of a DeepSeek config, None for another family."""
    if model_type not in DEEPSEEK_MODEL_TYPES:
        return None
    q_lora = config.get("q_lora_rank")
    return MlaParams(
        kv_lora_rank=int_field(config, "kv_lora_rank"),
        q_lora_rank=None if q_lora is None else int_field(config, "q_lora_rank"),
        qk_nope_head_dim=int_field(config, "qk_nope_head_dim"),
        qk_rope_head_dim=int_field(config, "qk_rope_head_dim"),
        v_head_dim=int_field(config, "v_head_dim"),
        rope_interleave=model_type == "deepseek_v2" or bool(config.get("rope_interleave", True)),
    )


def deepseek_moe_params(config: Mapping[str, Any], model_type: str) -> DeepseekMoeParams | None:
    """The router and experts of a DeepSeek config, None for another family.

    Raises UnsupportedModelError for a scoring function or top-k method the version does not
    run, ValueError naming the field for a bad count."""
    if model_type not in DEEPSEEK_MODEL_TYPES:
        return None
    scoring, methods = _ROUTERS[model_type]
    if config.get("scoring_func", scoring) != scoring:
        raise UnsupportedModelError(
            f"config.json: `scoring_func` must be {scoring!r} for {model_type}; "
            f"got {config.get('scoring_func')!r}"
        )
    method = str(config.get("topk_method") or methods[0])
    if model_type == "deepseek_v3":
        method = "noaux_tc"  # transformers' V3 router runs it whatever the config names
    if method not in methods:
        raise UnsupportedModelError(
            f"config.json: `topk_method` must be one of {', '.join(methods)} for {model_type}; "
            f"got {method!r}"
        )
    num_experts = int_field(config, "n_routed_experts")
    top_k = int_field(config, "num_experts_per_tok")
    grouped = method != "greedy"
    num_groups = int_field(config, "n_group", default=1) if grouped else 1
    topk_groups = int_field(config, "topk_group", default=1) if grouped else 1
    if num_experts % num_groups or topk_groups > num_groups or top_k > num_experts:
        raise ValueError(
            f"config.json: `n_group` ({num_groups}) must divide `n_routed_experts` "
            f"({num_experts}), `topk_group` ({topk_groups}) be at most `n_group`, and "
            f"`num_experts_per_tok` ({top_k}) at most `n_routed_experts`"
        )
    return DeepseekMoeParams(
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        expert_intermediate_size=int_field(config, "moe_intermediate_size"),
        num_shared_experts=_count(config, "n_shared_experts"),
        scoring_func=scoring,
        topk_method=method,
        num_groups=num_groups,
        topk_groups=topk_groups,
        routed_scaling_factor=float_field(config, "routed_scaling_factor", default=1.0),
        renormalize=bool(config.get("norm_topk_prob", False)),
        first_k_dense_replace=_count(config, "first_k_dense_replace"),
    )


def _count(config: Mapping[str, Any], key: str) -> int:
    """A non-negative integer field, 0 when absent."""
    value = config.get(key) or 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"config.json: `{key}` must be a non-negative integer; got {value!r}")
    return value
