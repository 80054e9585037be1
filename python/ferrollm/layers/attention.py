"""Paged attention over the scheduler's block tables.

The KV cache of a layer is ``k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]``;
token slot ``s`` is block ``s // block_size``, offset ``s % block_size``. Each step the model
writes its new tokens' K/V at ``plan.slot_mapping`` and then attends, per row, over the first
``context_lens[r]`` tokens reached through ``block_tables[r]``, a query at position ``p`` seeing
keys at positions ``<= p``. That one rule covers prefill, chunked prefill (a row starting past
0), decode, prefix-cache hits (the cached blocks are simply in the table), recompute after
preemption, and copy-on-write forks (the runner copies blocks before the forward).

The backend is a seam: ``TorchSDPABackend`` (plain torch, used on CPU and CUDA) gathers each
row's context into a padded batch and runs ``scaled_dot_product_attention``; the platform layer
may supply fused kernels instead. Everything per-step (gather indices, masks) is built once in
``prepare`` and shared by all layers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import nn

_Int = npt.NDArray[np.int64]


class PagedBatch(Protocol):
    """What attention needs of a step; ``ferrollm.StepPlan`` provides it."""

    @property
    def positions(self) -> npt.NDArray[np.int64]: ...
    @property
    def slot_mapping(self) -> npt.NDArray[np.int64]: ...
    @property
    def cu_seqlens_q(self) -> npt.NDArray[np.int32]: ...
    @property
    def context_lens(self) -> npt.NDArray[np.int32]: ...
    @property
    def block_tables(self) -> npt.NDArray[np.int32]: ...


class AttentionBackend(Protocol):
    """Builds per-step metadata once, then computes attention for each layer."""

    name: str

    def prepare(
        self,
        batch: PagedBatch,
        block_size: int,
        device: torch.device,
        sliding_window: int | None = None,
    ) -> Any:
        """Per-step metadata (indices, masks) on ``device``, shared by every layer."""
        ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: Any,
        scale: float,
    ) -> torch.Tensor:
        """Write ``k, v [T, kv_heads, D]`` to the cache; attend ``q [T, heads, D]`` -> like q."""
        ...


class CappingBackend(AttentionBackend, Protocol):
    """A backend that can also cap the attention scores (``cap * tanh(s / cap)``, Gemma 2)."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: Any,
        scale: float,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """``AttentionBackend.forward``, the scores capped at ``softcap`` when given."""
        ...


def backend_for(
    backend: AttentionBackend, *, softcap: float | None = None, values_are_keys: bool = False
) -> AttentionBackend:
    """``backend``, or the gathered SDPA backend (``TorchSDPABackend``) where a model needs
    what only it does: capped attention scores (``softcap``: its math path, which its
    subclasses such as the CUDA platform's Triton backend keep), or one cache tensor serving as
    both keys and values (``values_are_keys``: latent attention; the CPU kernel writes its two
    caches through two exclusive borrows, and the Triton kernel's tiles are sized for heads of
    at most 256, not a 576-wide latent)."""
    caps = softcap is None or isinstance(backend, TorchSDPABackend)
    shares = not values_are_keys or type(backend) is TorchSDPABackend
    return backend if caps and shares else TorchSDPABackend()


@dataclass(frozen=True)
class AttentionContext:
    """Everything a model's attention layers need for one step."""

    backend: AttentionBackend
    #: The metadata of the model's own window (``CausalLM.sliding_window``).
    metadata: Any
    kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    #: Metadata of the other windows some layers use (``CausalLM.layer_windows``), by window.
    windowed: Mapping[int, Any] = field(default_factory=dict)


class PagedAttention(nn.Module):
    """Attention of one layer over its slice of the paged KV cache (no parameters).

    ``window``: this layer's own sliding window where layers differ (Gemma's interleave; the
    step's metadata for it is ``ctx.windowed[window]``); None: the model's window.
    ``softcap``: scores become ``softcap * tanh(scores / softcap)`` before the softmax (Gemma
    2); the runner then attends with a backend that can (``backend_for``).
    """

    def __init__(
        self, layer_idx: int, scale: float, window: int | None = None, softcap: float | None = None
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.scale = scale
        self.window = window
        self.softcap = softcap

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """``q [T, heads, D]``, ``k, v [T, kv_heads, D]`` -> ``[T, heads, D]``."""
        kv_cache = ctx.kv_caches[self.layer_idx]
        metadata = ctx.metadata if self.window is None else ctx.windowed[self.window]
        if self.softcap is None:
            return ctx.backend.forward(q, k, v, kv_cache, metadata, self.scale)
        backend: CappingBackend = ctx.backend  # type: ignore[assignment]  # see backend_for
        return backend.forward(q, k, v, kv_cache, metadata, self.scale, self.softcap)


@dataclass(frozen=True)
class RowGroup:
    """Rows attended together, padded to ``max_q`` queries and ``max_ctx`` keys.

    ``q_index[g, i]`` is the token of query ``i`` of row ``g`` (padding repeats the row's last
    token, so no query row is fully masked); ``kv_slots[g, j]`` is the cache slot of key ``j``.
    Output ``out_src[i]`` of the flattened ``[rows * max_q]`` result is token ``out_dst[i]``;
    ``is_identity`` says the result already is every token in order (no scatter needed).
    """

    q_index: torch.Tensor
    kv_slots: torch.Tensor
    #: ``[rows, 1, max_q, max_ctx]``, True where a query sees a key; None with ``is_causal`` or
    #: when every query sees every key.
    mask: torch.Tensor | None
    is_causal: bool
    out_src: torch.Tensor
    out_dst: torch.Tensor
    is_identity: bool


@dataclass(frozen=True)
class SDPAMetadata:
    """Per-step data of ``TorchSDPABackend``."""

    slot_mapping: torch.Tensor
    groups: tuple[RowGroup, ...]


class TorchSDPABackend:
    """Paged attention with ``torch.nn.functional.scaled_dot_product_attention``.

    Rows are split into decodes (one query) and the rest, so one long prefill does not pad every
    decode row to its length; each group is one gather and one SDPA call, vectorized over its
    rows (no Python loop over sequences).
    """

    name = "torch_sdpa"

    def prepare(
        self,
        batch: PagedBatch,
        block_size: int,
        device: torch.device,
        sliding_window: int | None = None,
    ) -> SDPAMetadata:
        """Gather indices and causal masks for this step's rows (see ``RowGroup``)."""
        cu = batch.cu_seqlens_q.astype(np.int64)
        q_lens = cu[1:] - cu[:-1]
        num_tokens = int(cu[-1])
        groups = []
        for rows in (np.flatnonzero(q_lens == 1), np.flatnonzero(q_lens > 1)):
            if len(rows) > 0:
                group = plan_group(batch, rows, cu, q_lens, block_size, sliding_window)
                groups.append(group_to_device(group, num_tokens, device))
        slots = torch.from_numpy(batch.slot_mapping).to(device, non_blocking=True)
        return SDPAMetadata(slot_mapping=slots, groups=tuple(groups))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: SDPAMetadata,
        scale: float,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Write the step's K/V into the cache, then attend each group over its gathered keys
        (the scores capped at ``softcap`` when given)."""
        num_kv_heads, head_dim = k.shape[1], k.shape[2]
        k_flat = kv_cache[0].view(-1, num_kv_heads, head_dim)
        v_flat = kv_cache[1].view(-1, num_kv_heads, head_dim)
        # The cache may be stored narrower than the compute dtype (--kv-cache-dtype).
        k_flat.index_copy_(0, metadata.slot_mapping, k.to(k_flat.dtype))
        v_flat.index_copy_(0, metadata.slot_mapping, v.to(v_flat.dtype))
        gqa = q.shape[1] != num_kv_heads
        if len(metadata.groups) == 1 and metadata.groups[0].is_identity:
            return attend_group(q, k_flat, v_flat, metadata.groups[0], scale, gqa, softcap)
        out = torch.empty_like(q)
        for group in metadata.groups:
            o = attend_group(q, k_flat, v_flat, group, scale, gqa, softcap)
            out.index_copy_(0, group.out_dst, o.index_select(0, group.out_src))
        return out


def attend_group(
    q: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    group: RowGroup,
    scale: float,
    gqa: bool,
    softcap: float | None = None,
) -> torch.Tensor:
    """One SDPA call over a padded group (the math of `capped_attention` with ``softcap``);
    returns ``[rows * max_q, heads, D]``."""
    num_rows, max_q = group.q_index.shape
    if group.is_identity:
        qg = q.view(num_rows, max_q, q.shape[1], q.shape[2]).transpose(1, 2)
    else:
        qg = q[group.q_index].transpose(1, 2)
    kg = k_flat[group.kv_slots].transpose(1, 2).to(q.dtype)
    vg = v_flat[group.kv_slots].transpose(1, 2).to(q.dtype)
    if softcap is None:
        o = F.scaled_dot_product_attention(
            qg, kg, vg, attn_mask=group.mask, is_causal=group.is_causal, scale=scale, enable_gqa=gqa
        )
    else:
        o = capped_attention(qg, kg, vg, group, scale, softcap)
    return o.transpose(1, 2).reshape(num_rows * max_q, q.shape[1], q.shape[2])


def capped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: RowGroup, scale: float, cap: float
) -> torch.Tensor:
    """Attention whose scores are capped, ``cap * tanh(q k^T * scale / cap)``, before the mask
    and a float32 softmax: transformers' eager order for Gemma 2 (SDPA cannot cap).
    ``q [rows, heads, Q, D]``, ``k, v [rows, kv_heads, K, D]``."""
    if k.shape[1] != q.shape[1]:  # grouped-query: each KV head serves a run of query heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    scores = torch.tanh(scores / cap) * cap
    mask = group.mask
    if mask is None and group.is_causal:
        size = scores.shape[-1]
        mask = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def plan_group(
    batch: PagedBatch,
    rows: _Int,
    cu: _Int,
    q_lens: _Int,
    block_size: int,
    sliding_window: int | None,
) -> dict[str, npt.NDArray[Any]]:
    """Host-side (numpy) indices and mask of one group of rows."""
    lens = q_lens[rows]
    max_q = int(lens.max())
    max_ctx = int(batch.context_lens[rows].max())
    offsets = np.arange(max_q)
    q_index = cu[rows][:, None] + np.minimum(offsets, lens[:, None] - 1)
    valid = offsets[None, :] < lens[:, None]
    key_pos = np.arange(max_ctx)
    tables = batch.block_tables[rows].astype(np.int64)
    kv_slots = tables[:, key_pos // block_size] * block_size + key_pos % block_size
    q_pos = batch.positions[q_index]
    # Keys past a row's context sit beyond its last query position, so causality alone masks
    # them (and the null-block padding they point at).
    mask = key_pos[None, None, :] <= q_pos[:, :, None]
    if sliding_window is not None:
        mask &= key_pos[None, None, :] > q_pos[:, :, None] - sliding_window
    out_src = np.flatnonzero(valid.ravel())
    return {
        "q_index": q_index,
        "kv_slots": kv_slots,
        "mask": mask[:, None],
        "out_src": out_src,
        "out_dst": q_index.ravel()[out_src],
    }


def group_to_device(
    group: dict[str, npt.NDArray[Any]], num_tokens: int, device: torch.device
) -> RowGroup:
    """Move a planned group to ``device``, dropping the mask and scatter when not needed.

    A mask of all True (decodes of equal context) or the plain causal triangle (fresh prefills
    of equal length) is replaced by SDPA's maskless or ``is_causal`` path, which is faster.
    """
    mask = group.pop("mask")
    num_rows, max_q = group["q_index"].shape
    is_causal = max_q > 1 and mask.shape[-1] == max_q and _is_causal(mask)
    t = {name: torch.from_numpy(a).to(device, non_blocking=True) for name, a in group.items()}
    out_dst = group["out_dst"]
    # Identity: no padding (rows * max_q == len(out_dst)) and this group is every token in order.
    is_identity = num_rows * max_q == len(out_dst) == num_tokens and bool(
        (out_dst == np.arange(num_tokens)).all()
    )
    return RowGroup(
        **t,
        mask=None if is_causal or mask.all() else torch.from_numpy(mask).to(device),
        is_causal=is_causal,
        is_identity=is_identity,
    )


def _is_causal(mask: npt.NDArray[np.bool_]) -> bool:
    size = mask.shape[-1]
    return bool((mask == np.tri(size, dtype=np.bool_)).all())
