"""Many adapters in one batch: each projection adds its rows' low-rank deltas after the base.

`attach_lora` gives every adaptable `Linear` (``ferrollm.lora.targets``) a `LoRALinear` holding
``max_loras`` slots of up to rank ``max_lora_rank``, zero until filled, in blocks of ``R`` (the
largest rank loaded so far, not the cap: `LoRAState.stride`): ``a [S*n*R, in]``, the A
of every (slot, shard), slot-major, and ``b [out, S*R]``, each slot's B side by side (a
shard's rows of it in that shard's output rows). The runner sets one slot per token before each
forward (`LoRAState.set_token_slots`, -1 = the base model); the base product runs once for the
whole batch, then, for the slots ``[0, u)`` up to the highest the step reads (``n`` shards)::

    h = (x @ a[:u*n*R].T) * mask  # [T, u, n, R]; mask keeps, per row, only its own slot
    out[:, shard k] += h[:, :, k] @ b[shard k rows, :u*R].T

A base row's mask is all zero, so its delta is exactly zero, and a step with no adapter row
adds nothing at all. The mask is built once per step for all layers; the manager fills the
lowest free slots first, so a step that mixes few adapters computes few slots whatever
``max_loras`` is. The tensors the layers read are allocated once and refilled in place.

Measured (``benches/lora_layers.py --repeats 200``, float32, best of 200, 2 threads of a shared
"Intel(R) Xeon(R) Processor" with AVX2, AVX-512 (VNNI, BF16, FP16), no AMX, other jobs
running: noisy) at SmolLM2-135M's shapes, S=4, r=16,
rows spread over the base and the four slots; microseconds per call, the base product alone
first, then base + delta for masked (this), masked with one block-diagonal B, segmented (rows
sorted by slot, a pair of matmuls per active slot, ``index_add_``) and gathered (punica's
bgmv: each row's A and B gathered, two ``bmm``)::

    shape    T   base  masked  masked_bd  segmented  gathered
    qkv      1     22      56         46         60        77
    qkv      8     81     136        140        221       353
    qkv     32    157     244        272        358      1120
    o        1     14      28         26         44        51
    o        8     50      72         67        151       152
    o       32     95     120        132        227       425
    o      256    508     715        735        805      2866
    gate_up  1    119     168        174        185       203
    gate_up  8    345     492        464        528       789
    gate_up 32    562     722        745        810      2011
    gate_up 256  3120    3807       4193       4088     91104
    down     8     87     127        125        240       270
    down    32    367     429        441        544       900
    down   256   1493    1723       1946       1886      5412

(qkv at 256 rows and down at 1 row hit another job's burst; see the bench for a rerun.)
Segmented pays a host sync and per-slot calls; gathered copies ``T`` A and B matrices. Tensor
parallelism: a column-parallel layer keeps the whole A and its rows of B; a row-parallel one
(o_proj, down_proj) keeps A's columns of its input slice, and adds its partial delta before the
all-reduce (``B (x A.T)`` is the sum over ranks of ``B (x_r A_r.T)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ferrollm.lora.adapter import LoRAAdapter, LoRAError
from ferrollm.lora.delta import add_delta
from ferrollm.lora.graph_op import lora_delta
from ferrollm.lora.targets import Target, lora_targets

#: Rows the per-step buffers hold at first; a larger step grows them (once).
DEFAULT_MAX_NUM_TOKENS = 2048


class LoRALinear(nn.Module):
    """The adapters' deltas of one `Linear` (``layer.lora``); its tensors are buffers filled in
    place by `LoRAState`, never reassigned, except ``mask`` when a step outgrows it."""

    a: torch.Tensor  # [S*n*R, in], slot-major: slot s, shard k at rows (s*n + k)*R
    b: torch.Tensor  # [out, S*R], slot s at columns s*R
    mask: torch.Tensor  # [max_num_tokens, S]: 1 where the token reads the slot (shared)
    sizes: torch.Tensor  # int64 [2]: (used, rank), what the compiled op reads (shared)

    def __init__(
        self,
        target: Target,
        max_loras: int,
        rank: int,
        mask: torch.Tensor,
        sizes: torch.Tensor,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.target = target
        #: Each slot's block of A rows / B columns: the largest rank loaded so far (at most
        #: ``rank``, the capacity; `LoRAState.load_slot` widens it, `restride` moves blocks).
        self.rank = 1
        self.num_shards = n = len(target.shards)
        in_local = target.cols[1] - target.cols[0]
        out_local = target.layer.out_features
        device = mask.device
        rows, cols = max_loras * n * rank, max_loras * rank
        self.register_buffer(
            "a", torch.zeros(rows, in_local, dtype=dtype, device=device), persistent=False
        )
        self.register_buffer(
            "b", torch.zeros(out_local, cols, dtype=dtype, device=device), persistent=False
        )
        self.register_buffer("mask", mask, persistent=False)
        self.register_buffer("sizes", sizes, persistent=False)
        self.row_slices = [(s.local.start, s.local.stop) for s in target.shards]
        self.flat_slices = [i for pair in self.row_slices for i in pair]
        #: Whether any token of the step reads an adapter (a base-only step adds nothing), and
        #: the slots ``[0, used)`` the step's tokens read (the others are not computed).
        self.active = True
        self.used = max_loras

    def add(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out [T, out]`` (the base product of ``x [T, in]``) plus each row's delta (none
        when no row of the step reads an adapter: `LoRAState.set_token_slots`). Traced into a
        compiled graph, the delta is one opaque op that reads the sizes when it runs
        (``ferrollm.lora.graph_op``)."""
        if not self.active:
            return out
        if torch.compiler.is_compiling():
            delta: torch.Tensor = lora_delta(
                x, out, self.a, self.b, self.mask, self.sizes, self.flat_slices
            )
            return delta
        return add_delta(x, out, self.a, self.b, self.mask, self.used, self.rank, self.row_slices)


class LoRAState:
    """Every `LoRALinear` of a model and the per-step slot of each token."""

    def __init__(
        self,
        layers: dict[tuple[int, str], LoRALinear],
        max_loras: int,
        max_lora_rank: int,
        max_num_tokens: int,
    ) -> None:
        self.layers = layers
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        first = next(iter(layers.values()))
        self.dtype = first.a.dtype
        self.device = first.a.device
        #: The slot numbers, compared with each token's slot to build the mask.
        self.slot_ids = torch.arange(max_loras, device=self.device)
        #: The step's slot per token (-1 = base); rows past the step's tokens are -1.
        self.token_slots = torch.full((max_num_tokens,), -1, dtype=torch.int64, device=self.device)
        self._num_set = 0
        #: Each slot's block size: the largest rank loaded so far (``max_lora_rank`` is only
        #: the capacity), so rank-16 adapters under the default cap of 64 compute 16 columns.
        self.stride = 1
        #: Which adapter fills each slot (None = empty).
        self.slots: list[str | None] = [None] * max_loras
        #: Whether the next forward reads any slot, and how many from slot 0 it computes (the
        #: layers' ``active`` and ``used``).
        self.active = True
        self.used = max_loras

    @property
    def mask(self) -> torch.Tensor:
        """``[max_num_tokens, S]``: 1 where the token reads the slot (shared)."""
        return first_layer(self.layers.values()).mask

    @property
    def sizes(self) -> torch.Tensor:
        """int64 ``[2]``: the slots a step computes and their block size (shared)."""
        return first_layer(self.layers.values()).sizes

    def set_token_slots(self, slots: torch.Tensor) -> None:
        """The slot of each of the next forward's ``T`` tokens (int64 ``[T]``, -1 = base model);
        ValueError on a slot out of range."""
        num_tokens = len(slots)
        if num_tokens and (int(slots.max()) >= self.max_loras or int(slots.min()) < -1):
            raise ValueError(f"token slots must be in [-1, {self.max_loras}); got {slots.tolist()}")
        if num_tokens > len(self.token_slots):
            self._grow(num_tokens)
        self.token_slots[:num_tokens].copy_(slots)
        stale = max(self._num_set, num_tokens)
        self.token_slots[num_tokens:stale].fill_(-1)
        mask = self.mask
        mask[:num_tokens].copy_(self.token_slots[:num_tokens, None] == self.slot_ids)
        mask[num_tokens:stale].zero_()
        self._num_set = num_tokens
        self._set_used(int(slots.max()) + 1 if num_tokens else 0)

    def set_base_only(self) -> None:
        """The next forward reads no adapter: the layers skip their deltas. The mask is left as
        it is (unread until a step reads an adapter, which rewrites its rows: cheaper than
        `set_token_slots` for the common step)."""
        self._set_used(0)

    def _set_used(self, used: int) -> None:
        if (used > 0, used) != (self.active, self.used):
            self.active, self.used = used > 0, used
            self.sizes[0] = max(used, 1)
            for lora in self.layers.values():
                lora.active, lora.used = used > 0, used

    @contextmanager
    def reading_adapters(self, active: bool) -> Iterator[None]:
        """Within: every layer as in a step that reads an adapter (``active``) or reads none,
        whatever the slots hold; a compiled decode graph is built for both kinds of step
        (``ferrollm.lora.graph_op``)."""
        saved = self.active
        for lora in self.layers.values():
            lora.active = active
        try:
            yield
        finally:
            for lora in self.layers.values():
                lora.active = saved

    def load_slot(self, slot: int, adapter: LoRAAdapter) -> None:
        """Fill ``slot`` with ``adapter`` (this rank's share of it); projections the adapter
        leaves alone get zeros. LoRAError if its rank exceeds the slots'."""
        self._check_slot(slot)
        if adapter.rank > self.max_lora_rank:
            raise LoRAError(
                f"adapter `{adapter.name}` has rank {adapter.rank}, above `max_lora_rank` "
                f"{self.max_lora_rank}"
            )
        if adapter.rank > self.stride:
            self._restride(adapter.rank)
        self.clear_slot(slot)
        for (layer, module), lora in self.layers.items():
            target = lora.target
            for k, shard in enumerate(target.shards):
                weights = adapter.weights.get((layer, module, shard.name))
                if weights is None:
                    continue
                r = weights.a.shape[0]
                a_rows = (slot * lora.num_shards + k) * self.stride
                a = weights.a[:, target.cols[0] : target.cols[1]]
                lora.a[a_rows : a_rows + r].copy_(a)
                b = weights.b[shard.rows[0] : shard.rows[1]]
                cols = slot * self.stride
                lora.b[shard.local, cols : cols + r].copy_(b)
        self.slots[slot] = adapter.name

    def clear_slot(self, slot: int) -> None:
        """Zero ``slot``: rows still pointing at it get the base model's output."""
        self._check_slot(slot)
        rank = self.stride
        for lora in self.layers.values():
            n = lora.num_shards
            lora.a[slot * n * rank : (slot + 1) * n * rank].zero_()
            lora.b[:, slot * rank : (slot + 1) * rank].zero_()
        self.slots[slot] = None

    def _restride(self, stride: int) -> None:
        """Widen every slot's block to ``stride`` rows of A and columns of B, moving the loaded
        slots' blocks up (the highest first, so no block overwrites one not yet moved)."""
        old = self.stride
        for lora in self.layers.values():
            n = lora.num_shards
            for block in reversed(range(self.max_loras * n)):
                lora.a[block * stride : block * stride + old] = lora.a[
                    block * old : (block + 1) * old
                ].clone()
                lora.a[block * stride + old : (block + 1) * stride].zero_()
            for slot in reversed(range(self.max_loras)):
                lora.b[:, slot * stride : slot * stride + old] = lora.b[
                    :, slot * old : (slot + 1) * old
                ].clone()
                lora.b[:, slot * stride + old : (slot + 1) * stride].zero_()
            lora.rank = stride
        self.stride = stride
        self.sizes[1] = stride

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_loras:
            raise ValueError(f"LoRA slot {slot} is not in [0, {self.max_loras})")

    def _grow(self, num_tokens: int) -> None:
        """Larger per-step buffers (a compiled graph retraces once for them)."""
        self.token_slots = torch.full((num_tokens,), -1, dtype=torch.int64, device=self.device)
        mask = self.mask.new_zeros((num_tokens, self.mask.shape[1]))
        for lora in self.layers.values():
            lora.mask = mask
        self._num_set = 0


def attach_lora(
    model: nn.Module,
    max_loras: int,
    max_lora_rank: int,
    *,
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS,
    dtype: torch.dtype | None = None,
) -> LoRAState:
    """Give every adaptable projection of ``model`` (loaded, on its device) ``max_loras`` empty
    slots of rank ``max_lora_rank``, in ``dtype`` (None: the layers' compute dtype; float32 on
    a CPU, whose small reduced-precision matmuls are slower); the model then computes the
    base output for every token until slots are filled and tokens pointed at them."""
    if max_loras < 1 or max_lora_rank < 1:
        raise ValueError(
            f"`max_loras` and `max_lora_rank` must be at least 1; got {max_loras}, {max_lora_rank}"
        )
    targets = lora_targets(model)
    if not targets:
        raise ValueError(f"{type(model).__name__} has no projection a LoRA adapter can target")
    device = _device(model)
    dtype = dtype or first_target(targets.values()).layer.compute_dtype
    mask = torch.zeros(max_num_tokens, max_loras, dtype=dtype, device=device)
    sizes = torch.tensor([max_loras, 1], dtype=torch.int64, device=device)
    layers: dict[tuple[int, str], LoRALinear] = {}
    for key, target in targets.items():
        lora = LoRALinear(target, max_loras, max_lora_rank, mask, sizes, dtype)
        target.layer.lora = lora
        layers[key] = lora
    return LoRAState(layers, max_loras, max_lora_rank, max_num_tokens)


def detach_lora(state: LoRAState) -> None:
    """Remove the adapters' layers: the model is its base again."""
    for lora in state.layers.values():
        lora.target.layer.lora = None


def first_layer(layers: Iterable[LoRALinear]) -> LoRALinear:
    return next(iter(layers))


def first_target(targets: Iterable[Target]) -> Target:
    return next(iter(targets))


def _device(model: nn.Module) -> torch.device:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")
