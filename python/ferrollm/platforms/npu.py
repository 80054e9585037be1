"""The Ascend NPU platform, written against torch-npu's documented API.

NOT RUN ON HARDWARE. No Ascend device was available while this was written: the code follows
the torch-npu operator documentation (``torch_npu.npu_fused_infer_attention_score``,
``torch_npu.npu_rms_norm``, ``torch_npu.npu_rotary_mul``) and the ``torch.npu`` device API that
torch-npu installs (``is_available``, ``device_count``, ``mem_get_info``, ``synchronize``), but
it has never executed on an NPU. Treat it as a starting point to verify, not a tested backend.

``torch_npu`` is imported lazily, so this module imports cleanly (and ``NpuPlatform.available()``
is simply False) where it is not installed.

Paged attention is one fused call per layer over the scheduler's block tables: the query is
``TND`` (the step's tokens, flat), the KV cache of a layer is read in place as
``[num_blocks, block_size, num_kv_heads * head_dim]`` through ``block_table``, and
``sparse_mode=3`` (right-down causal, with the kernel's fixed 2048 x 2048 mask) lets a row's
queries see every cached key up to their own position. That one rule covers prefill, chunked
prefill, decode and prefix-cache hits, like the CPU backend. The kernel's paged mode needs
float16 or bfloat16 and a block size that is a multiple of 128 (at most 512).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

from ferrollm.layers.attention import AttentionBackend, PagedBatch
from ferrollm.platforms.base import MemoryInfo, Platform

#: The side of the optimized causal mask ``sparse_mode=3`` requires (torch-npu docs).
_MASK_SIZE = 2048


def _torch_npu() -> Any:
    """The ``torch_npu`` module (importing it registers the "npu" device with torch)."""
    return importlib.import_module("torch_npu")


class NpuPlatform(Platform):
    """One Ascend NPU (the current device; pick another with ASCEND_RT_VISIBLE_DEVICES)."""

    name = "npu"
    dist_backend = "hccl"
    is_accelerator = True
    preferred_dtype = torch.bfloat16
    # The fused attention kernel's paged mode reads float16/bfloat16 caches only.
    supported_dtypes = (torch.bfloat16, torch.float16)

    @classmethod
    def available(cls) -> bool:
        """Whether ``torch_npu`` imports and sees at least one device."""
        try:
            npu = _torch_npu().npu
            return bool(npu.is_available()) and int(npu.device_count()) > 0
        except Exception:  # ImportError, or a broken driver/CANN install: no NPU then
            return False

    def attention_backend(self) -> AttentionBackend:
        """``npu_fused_infer_attention_score`` over the block tables."""
        return NpuPagedAttentionBackend()

    def set_device(self, index: int) -> None:
        """``torch.npu.set_device`` (importing torch_npu also registers the ``hccl`` backend
        with torch.distributed)."""
        _torch_npu().npu.set_device(index)

    def synchronize(self) -> None:
        """Wait for every queued kernel on the current device."""
        _torch_npu().npu.synchronize()

    def memory_info(self) -> MemoryInfo:
        """Free and total bytes of the current device (``torch.npu.mem_get_info``)."""
        free, total = _torch_npu().npu.mem_get_info()
        return MemoryInfo(free=int(free), total=int(total))

    def check_block_size(self, block_size: int) -> None:
        """The fused kernel's paged mode takes blocks of 128, 256, 384 or 512 tokens."""
        if block_size % 128 or not 128 <= block_size <= 512:
            raise ValueError(
                "`block_size` must be a multiple of 128 in [128, 512] on npu "
                f"(npu_fused_infer_attention_score's paged mode); got {block_size}"
            )


@dataclass(frozen=True)
class NpuAttentionMetadata:
    """Per-step inputs of the fused kernel, shared by every layer."""

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    #: Cumulative query ends per row (``cu_seqlens_q[1:]``), as ``TND`` layout wants.
    actual_seq_lengths: list[int]
    #: Keys each row attends to (its context length), not cumulative.
    actual_seq_lengths_kv: list[int]
    block_size: int
    #: True above the diagonal: the masked-out part of the fixed causal mask.
    causal_mask: torch.Tensor


class NpuPagedAttentionBackend:
    """Paged attention with ``torch_npu.npu_fused_infer_attention_score`` (not run on hardware)."""

    name = "npu_fused_infer_attention"

    def __init__(self) -> None:
        # The fixed causal mask, built once per device rather than sent every step.
        self._masks: dict[torch.device, torch.Tensor] = {}

    def prepare(
        self,
        batch: PagedBatch,
        block_size: int,
        device: torch.device,
        sliding_window: int | None = None,
    ) -> NpuAttentionMetadata:
        """Move the block tables and slots to the NPU; the lengths stay host lists."""
        if sliding_window is not None:
            raise NotImplementedError(
                "sliding-window attention is not implemented on npu; use device='cpu' or 'cuda'"
            )
        if device not in self._masks:
            mask = torch.ones(_MASK_SIZE, _MASK_SIZE, dtype=torch.bool).triu(diagonal=1)
            self._masks[device] = mask.to(device)
        return NpuAttentionMetadata(
            slot_mapping=torch.from_numpy(batch.slot_mapping).to(device, non_blocking=True),
            block_tables=torch.from_numpy(batch.block_tables).to(device, non_blocking=True),
            actual_seq_lengths=batch.cu_seqlens_q[1:].tolist(),
            actual_seq_lengths_kv=batch.context_lens.tolist(),
            block_size=block_size,
            causal_mask=self._masks[device],
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: NpuAttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Write ``k, v [T, kv_heads, D]`` into the cache, then attend ``q [T, heads, D]``."""
        num_blocks, block_size, num_kv_heads, head_dim = kv_cache[0].shape
        # Plain-torch scatter of the new keys/values: portable, and the same as the CPU path.
        kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, metadata.slot_mapping, k)
        kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, metadata.slot_mapping, v)
        out, _lse = _torch_npu().npu_fused_infer_attention_score(
            q.contiguous(),
            kv_cache[0].view(num_blocks, block_size, num_kv_heads * head_dim),
            kv_cache[1].view(num_blocks, block_size, num_kv_heads * head_dim),
            atten_mask=metadata.causal_mask,
            block_table=metadata.block_tables,
            actual_seq_lengths=metadata.actual_seq_lengths,
            actual_seq_lengths_kv=metadata.actual_seq_lengths_kv,
            num_heads=q.shape[1],
            num_key_value_heads=num_kv_heads,
            scale=scale,
            input_layout="TND",
            sparse_mode=3,
            block_size=metadata.block_size,
        )
        result: torch.Tensor = out.view_as(q)
        return result


def npu_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``RMSNorm`` of ``x [..., size]`` with the fused ``torch_npu.npu_rms_norm`` kernel."""
    out, _rstd = _torch_npu().npu_rms_norm(x, weight, epsilon=eps)
    result: torch.Tensor = out
    return result


def npu_apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``ferrollm.layers.rotary.apply_rotary`` with ``torch_npu.npu_rotary_mul`` (half mode).

    ``x [T, heads, D]`` is viewed as ``BSND`` with B = 1, and ``cos``/``sin [T, D]`` as ``1S1D``.
    """
    out = _torch_npu().npu_rotary_mul(x.unsqueeze(0), cos[None, :, None], sin[None, :, None])
    result: torch.Tensor = out.squeeze(0)
    return result
