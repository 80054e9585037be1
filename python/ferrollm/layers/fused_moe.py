"""Mixture-of-experts pieces shared by the MoE families: the expert, routing and the dispatch.

Routing (`select_experts`) is a softmax over the router's logits in float32, then the top-k,
optionally renormalised to sum to one (transformers' order: softmax before top-k).
DeepSeek's router (`select_grouped_experts`) first keeps only the best ``topk_groups`` of
``num_groups`` equal groups of experts, then takes the top-k among those; V3's sigmoid scores
choose with a per-expert correction bias added, but weigh with the scores without it.

The dispatch (`dispatch`) groups rows by expert instead of looping over tokens: the step's
``T * k`` (token, expert) assignments are sorted by expert (stably, so each expert's rows stay
in token order), the hidden states gathered once in that order, and each expert with rows runs
its gate_up, activation and down once, on its contiguous slice; experts with no rows are
skipped. The outputs are scaled by their routing weights and summed back into their tokens with
one ``index_add_``. A decode step of a few rows thus runs only the experts its tokens chose,
and a prefill runs each expert once however many tokens chose it. The one host sync per layer
is the per-expert row counts, which the slicing needs.

Each expert is a pair of `Linear` layers, so a ``quantization`` scheme keeps every expert's
weights in its block kernels, exactly as a dense model's MLP. Under tensor parallelism each
expert holds its rank's slice of the intermediate features: the down products are then
partial sums, reduced once per layer by the caller (``ferrollm.models.moe``), not per expert.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ferrollm.layers.activation import ACTIVATIONS
from ferrollm.layers.linear import Linear


class Expert(nn.Module):
    """One gated feed-forward expert, ``down(act(gate(x)) * up(x))``, without bias and without
    a reduce (its rows of ``intermediate_size`` may be a rank's slice)."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, act: str, scheme: str | None
    ) -> None:
        super().__init__()
        shards = [("gate_proj", intermediate_size), ("up_proj", intermediate_size)]
        self.gate_up_proj = Linear(hidden_size, shards, bias=False, scheme=scheme)
        self.down_proj = Linear(
            intermediate_size, [("down_proj", hidden_size)], bias=False, scheme=scheme
        )
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [rows, hidden]`` -> ``[rows, hidden]``."""
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        out: torch.Tensor = self.down_proj(self.act(gate) * up)
        return out


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, k] float32, expert ids [T, k])`` from ``router_logits [T, num_experts]``."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def select_grouped_experts(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    scoring_func: str,
    num_groups: int,
    topk_groups: int,
    renormalize: bool,
    scaling_factor: float = 1.0,
    correction_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's ``(weights [T, k] float32, expert ids [T, k])`` from ``router_logits``.

    ``scoring_func`` "softmax" (V2: a group scores its best expert) or "sigmoid" (V3: a group
    scores the sum of its best two, ``correction_bias`` added for choosing only). One group
    (``num_groups`` 1) is plain top-k. Weights are renormalised with ``renormalize`` and then
    multiplied by ``scaling_factor``."""
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring_func == "softmax" else logits.sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if num_groups > 1:
        grouped = choice.view(choice.shape[0], num_groups, -1)
        if scoring_func == "softmax":
            group_scores = grouped.max(dim=-1).values
        else:
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        groups = torch.topk(group_scores, topk_groups, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
        # transformers zeroes V2's dropped softmax scores and sets V3's to -inf; either way a
        # kept expert outranks a dropped one wherever the top-k is taken among kept ones.
        dropped = 0.0 if scoring_func == "softmax" else float("-inf")
        choice = grouped.masked_fill(~keep[..., None], dropped).view_as(choice)
    ids = torch.topk(choice, top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling_factor, ids


def dispatch(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    experts: Sequence[Callable[[torch.Tensor], torch.Tensor]],
) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] * experts[ids[t, j]](x[t])`` for each row of ``x [T, H]``,
    every expert called once, on all of its rows (see the module docstring)."""
    top_k = ids.shape[1]
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    tokens = order // top_k  # the token of each sorted assignment
    counts = expert_counts(ids, len(experts))
    rows = x.index_select(0, tokens)
    outs = []
    start = 0
    for expert, count in zip(experts, counts, strict=True):
        if count:
            outs.append(expert(rows[start : start + count]))
            start += count
    out = torch.zeros_like(x)
    if not outs:
        return out
    routed = torch.cat(outs) * weights.reshape(-1)[order, None].to(x.dtype)
    return out.index_add_(0, tokens, routed)


def expert_counts(ids: torch.Tensor, num_experts: int) -> list[int]:
    """Rows routed to each expert by ``ids [T, k]`` (one host sync)."""
    counts: list[int] = torch.bincount(ids.reshape(-1), minlength=num_experts).tolist()
    return counts
