"""What rank 0 sends the workers each step: tensors over ``torch.distributed.broadcast``.

A message is a fixed-size int64 header (the op code and every size the workers need to
allocate the rest), then one int64 payload holding all the plan's columns and the step's extras'
indices back to back, then, when the step overrides input embeddings, one float32 ``[m, hidden]``
tensor. Nothing is pickled: the receiving side knows every shape from the header. Ops:

* ``STEP``: run one step (``ModelRunner.run`` with the same arguments rank 0 passes);
* ``PING``: a heartbeat while rank 0 is idle (workers answer in a one-element all-reduce, so a
  rank that hangs is noticed and the workers' own receive timeout never fires);
* ``SHUTDOWN``: leave the worker loop and exit 0;
* ``LORA_SLOT``: read the LoRA adapter at a path into a slot (``ferrollm.lora``): the workers
  read it from its directory themselves; the header holds the slot and the payload the UTF-8
  bytes of ``name`` NUL ``path``. A ``STEP`` then carries each token's slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

from ferrollm.distributed.state import ParallelState
from ferrollm.executor.prompt_logprobs import PromptTargets
from ferrollm.executor.runner import StepInputs, SyntheticPlan
from ferrollm.executor.step_extras import EmbeddingOverride, LogitRows


class Op(IntEnum):
    """What a message asks of the workers."""

    STEP = 1
    PING = 2
    SHUTDOWN = 3
    LORA_SLOT = 4


#: Header slots: the op, then the sizes below (-1 = that extra is absent).
HEADER_LEN = 12
_OP, _TOKENS, _ROWS, _TABLE_WIDTH, _SAMPLES, _COPIES = range(6)
_TARGETS, _TOP, _KEEP, _EMBEDS, _HIDDEN, _LORA = range(6, 12)
#: ``LORA_SLOT``'s header: the slot, and the bytes of ``name\0path``.
_SLOT, _NAME_BYTES = 1, 2


@dataclass(frozen=True)
class StepMessage:
    """One step as the workers rebuild it: the plan and what ``run`` was given with it."""

    plan: SyntheticPlan
    prompt_targets: PromptTargets | None
    embeds: EmbeddingOverride | None
    keep_logits: LogitRows | None
    #: Each token's LoRA slot (-1: the base model), when adapters are on.
    lora_slots: npt.NDArray[np.int64] | None = None


@dataclass(frozen=True)
class LoRASlotMessage:
    """``LORA_SLOT``: read adapter ``name`` from directory ``path`` into ``slot``."""

    slot: int
    name: str
    path: str


@dataclass(frozen=True)
class Channel:
    """Broadcasts over ``parallel``'s group; ``device`` is where the backend wants tensors (the
    CPU for gloo, the accelerator for nccl/hccl)."""

    parallel: ParallelState
    device: torch.device

    def _broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Broadcast from rank 0 in place (through ``device``); the CPU tensor."""
        if self.device.type == "cpu":
            dist.broadcast(tensor, 0, group=self.parallel.group)
            return tensor
        on_device = tensor.to(self.device)
        dist.broadcast(on_device, 0, group=self.parallel.group)
        return on_device.cpu()

    def send_op(self, op: Op) -> None:
        """Rank 0: broadcast a message without payload (``PING``, ``SHUTDOWN``)."""
        header = torch.full((HEADER_LEN,), -1, dtype=torch.int64)
        header[_OP] = op
        self._broadcast(header)

    def answer_ping(self) -> None:
        """Every rank, after a ``PING``: a one-element all-reduce that proves each rank is
        alive."""
        dist.all_reduce(
            torch.ones(1, dtype=torch.int64, device=self.device), group=self.parallel.group
        )

    def send_step(
        self,
        plan: StepInputs,
        prompt_targets: PromptTargets | None,
        embeds: EmbeddingOverride | None,
        keep_logits: LogitRows | None,
        lora_slots: torch.Tensor | None = None,
    ) -> None:
        """Rank 0: broadcast one step's plan columns and extras (and each token's LoRA slot)."""
        header = np.full(HEADER_LEN, -1, dtype=np.int64)
        rows = len(plan.cu_seqlens_q) - 1
        header[_OP] = Op.STEP
        header[_TOKENS] = len(plan.input_ids)
        header[_ROWS] = rows
        header[_TABLE_WIDTH] = plan.block_tables.shape[1] if plan.block_tables.ndim == 2 else 0
        header[_SAMPLES] = len(plan.logits_indices)
        header[_COPIES] = len(plan.block_copies)
        parts: list[npt.NDArray[np.integer]] = [
            plan.input_ids,
            plan.positions,
            plan.slot_mapping,
            plan.cu_seqlens_q,
            plan.context_lens,
            plan.block_tables.reshape(-1),
            plan.logits_indices,
            plan.block_copies.reshape(-1),
        ]
        if prompt_targets is not None:
            header[_TARGETS] = len(prompt_targets.token_indices)
            header[_TOP] = prompt_targets.num_top
            parts += [prompt_targets.token_indices, prompt_targets.target_ids]
        if keep_logits is not None:
            header[_KEEP] = len(keep_logits.token_indices)
            parts.append(keep_logits.token_indices)
        if embeds is not None:
            header[_EMBEDS], header[_HIDDEN] = embeds.rows.shape
            parts.append(embeds.token_indices.numpy())
        if lora_slots is not None:
            header[_LORA] = len(lora_slots)
            parts.append(lora_slots.cpu().numpy())
        payload = np.concatenate([np.asarray(p, dtype=np.int64).reshape(-1) for p in parts])
        self._broadcast(torch.from_numpy(header))
        self._broadcast(torch.from_numpy(payload))
        if embeds is not None:
            rows_f32 = embeds.rows.to("cpu", torch.float32).contiguous()
            self._broadcast(rows_f32)

    def send_lora_slot(self, slot: int, name: str, path: str) -> None:
        """Rank 0: tell the workers to read adapter ``name`` at ``path`` into ``slot``."""
        data = f"{name}\0{path}".encode()
        header = torch.full((HEADER_LEN,), -1, dtype=torch.int64)
        header[_OP], header[_SLOT], header[_NAME_BYTES] = Op.LORA_SLOT, slot, len(data)
        self._broadcast(header)
        self._broadcast(torch.tensor(list(data), dtype=torch.int64))

    def receive(self) -> tuple[Op, StepMessage | LoRASlotMessage | None]:
        """A worker: the next message from rank 0 (the step for ``STEP``, the slot for
        ``LORA_SLOT``, else None)."""
        header_t = torch.empty(HEADER_LEN, dtype=torch.int64)
        header_t = self._broadcast(header_t)
        header = header_t.tolist()
        op = Op(header[_OP])
        if op is Op.LORA_SLOT:
            data = self._broadcast(torch.empty(header[_NAME_BYTES], dtype=torch.int64))
            name, _, path = bytes(data.tolist()).decode().partition("\0")
            return op, LoRASlotMessage(header[_SLOT], name, path)
        if op is not Op.STEP:
            return op, None
        tokens, rows, width = header[_TOKENS], header[_ROWS], header[_TABLE_WIDTH]
        samples, copies = header[_SAMPLES], header[_COPIES]
        num_targets, num_keep, num_embeds = header[_TARGETS], header[_KEEP], header[_EMBEDS]
        num_lora = header[_LORA]
        sizes = [tokens, tokens, tokens, rows + 1, rows, rows * width, samples, copies * 2]
        sizes += [num_targets, num_targets] if num_targets >= 0 else []
        sizes += [num_keep] if num_keep >= 0 else []
        sizes += [num_embeds] if num_embeds >= 0 else []
        sizes += [num_lora] if num_lora >= 0 else []
        payload_t = torch.empty(sum(sizes), dtype=torch.int64)
        payload_t = self._broadcast(payload_t)
        payload = payload_t.numpy()
        columns = iter(np.split(payload, np.cumsum(sizes)[:-1]))
        plan = SyntheticPlan(
            input_ids=next(columns),
            positions=next(columns),
            slot_mapping=next(columns),
            cu_seqlens_q=next(columns).astype(np.int32),
            context_lens=next(columns).astype(np.int32),
            block_tables=next(columns).astype(np.int32).reshape(rows, width),
            logits_indices=next(columns),
            block_copies=next(columns).astype(np.int32).reshape(copies, 2),
        )
        targets = None
        if num_targets >= 0:
            targets = PromptTargets(next(columns), next(columns), header[_TOP])
        keep = LogitRows(next(columns)) if num_keep >= 0 else None
        embeds = None
        if num_embeds >= 0:
            indices = torch.from_numpy(next(columns))
        lora_slots = next(columns) if num_lora >= 0 else None
        if num_embeds >= 0:
            rows_f32 = torch.empty((num_embeds, header[_HIDDEN]), dtype=torch.float32)
            rows_f32 = self._broadcast(rows_f32)
            embeds = EmbeddingOverride(indices, rows_f32)
        return op, StepMessage(plan, targets, embeds, keep, lora_slots)
