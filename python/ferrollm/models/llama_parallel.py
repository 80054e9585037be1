"""How a Llama-family model splits across a tensor-parallel group, decided once at build time.

Rank ``r`` of ``n`` keeps query heads ``[r*H/n, (r+1)*H/n)``; KV heads split evenly when
``n`` divides them, and when there are fewer KV heads than ranks each rank keeps (a copy of)
the one KV head its query heads read. The MLP's intermediate features split evenly; the
vocabulary splits in padded ranges (a multiple of 16 rows, what the int4 kernel packs), the
padding stripped when the logits are gathered. `LlamaShardLayout.plan` turns this into the
`ShardPlan` the checkpoint reader follows. Combinations that cannot split are refused here,
with a ValueError naming ``tensor_parallel_size``, before anything is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ferrollm.distributed.shard_plan import ShardPlan, TensorSlice
from ferrollm.distributed.state import ParallelState

#: Input columns per quantization group of the int4 kernels (GGUF's block size too).
QUANT_GROUP = 32
#: Output rows the int4 pack needs a multiple of.
INT4_ROW_MULTIPLE = 16
_VOCAB_MULTIPLE = 16


class ShardedConfig(Protocol):
    """The sizes a layout splits (``ferrollm.models.llama.LlamaConfigLike`` has them)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...


class FusedPart(NamedTuple):
    """One projection inside a fused checkpoint tensor (Phi-3's ``qkv_proj``), in order."""

    shard: str  # the projection's shard name ("q_proj")
    rows: int  # its rows in the checkpoint tensor
    start: int  # this rank's [start, stop) of those rows
    stop: int


@dataclass(frozen=True)
class LlamaShardLayout:
    """This rank's share of every sharded dimension (the whole model when alone)."""

    parallel: ParallelState
    head_dim: int
    heads: tuple[int, int]  # query heads [start, stop)
    kv_heads: tuple[int, int]
    intermediate: tuple[int, int]
    vocab: tuple[int, int]  # checkpoint rows read (stop <= vocab_size)
    num_vocab_rows: int  # local table rows, padding included

    @property
    def num_heads(self) -> int:
        """Query heads on this rank."""
        return self.heads[1] - self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        """KV heads on this rank (its share of the KV cache)."""
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def intermediate_size(self) -> int:
        """MLP features on this rank."""
        return self.intermediate[1] - self.intermediate[0]

    @classmethod
    def build(
        cls, config: ShardedConfig, parallel: ParallelState, scheme: str | None
    ) -> LlamaShardLayout:
        """The layout of rank ``parallel.rank``; ValueError when the model cannot split."""
        n, r = parallel.world_size, parallel.rank
        heads, kv = config.num_attention_heads, config.num_key_value_heads
        _require(heads % n == 0, n, f"`num_attention_heads` ({heads}) must divide evenly")
        if kv % n == 0:
            kv_range = (r * kv // n, (r + 1) * kv // n)
        else:
            _require(
                n % kv == 0,
                n,
                f"`num_key_value_heads` ({kv}) must divide evenly across the ranks, or divide "
                f"`tensor_parallel_size` so that each rank's {heads // n} query heads share one "
                "KV head",
            )
            kv_range = (r * kv // n, r * kv // n + 1)
        inter = config.intermediate_size
        _require(inter % n == 0, n, f"`intermediate_size` ({inter}) must divide evenly")
        vocab = config.vocab_size
        rows = -(-vocab // n)
        if n > 1:
            rows = -(-rows // _VOCAB_MULTIPLE) * _VOCAB_MULTIPLE
        layout = cls(
            parallel=parallel,
            head_dim=config.head_dim,
            heads=(r * heads // n, (r + 1) * heads // n),
            kv_heads=kv_range,
            intermediate=(r * inter // n, (r + 1) * inter // n),
            vocab=(min(r * rows, vocab), min((r + 1) * rows, vocab)),
            num_vocab_rows=rows,
        )
        if n > 1 and scheme in ("int4", "native"):
            layout._check_int4_split(config)
        return layout

    def _check_int4_split(self, config: ShardedConfig) -> None:
        """The int4 kernel wants input groups of 32 and output rows in 16s, per rank."""
        n = self.parallel.world_size
        d = self.head_dim
        row_parallel = {
            "self_attn.o_proj": (config.num_attention_heads * d, self.num_heads * d),
            "mlp.down_proj": (config.intermediate_size, self.intermediate_size),
        }
        for name, (full, local) in row_parallel.items():
            _require(
                full % QUANT_GROUP != 0 or local % QUANT_GROUP == 0,
                n,
                f"`{name}`: each rank's {local} input columns are not a multiple of the "
                f"{QUANT_GROUP}-column quantization group",
            )
        kv_full = 2 * config.num_key_value_heads * d
        column_parallel = {
            "self_attn.qkv_proj": (
                config.num_attention_heads * d + kv_full,
                (self.num_heads + 2 * self.num_kv_heads) * d,
            ),
            "mlp.gate_up_proj": (2 * config.intermediate_size, 2 * self.intermediate_size),
        }
        for name, (full, local) in column_parallel.items():
            _require(
                full % INT4_ROW_MULTIPLE != 0 or local % INT4_ROW_MULTIPLE == 0,
                n,
                f"`{name}`: each rank's {local} output rows are not a multiple of "
                f"{INT4_ROW_MULTIPLE}, which the int4 kernel packs",
            )

    def fused_parts(self, config: ShardedConfig) -> dict[str, tuple[FusedPart, ...]]:
        """How this rank reads fused checkpoint tensors (by layer suffix): a rank's q, k and v
        rows are three ranges of ``qkv_proj``, not one, so no `TensorSlice` describes them;
        the tensor is read whole and split here, shard by shard."""
        d = self.head_dim
        q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
        q_local = (self.heads[0] * d, self.heads[1] * d)
        kv_local = (self.kv_heads[0] * d, self.kv_heads[1] * d)
        inter = config.intermediate_size
        return {
            "self_attn.qkv_proj": (
                FusedPart("q_proj", q, *q_local),
                FusedPart("k_proj", kv, *kv_local),
                FusedPart("v_proj", kv, *kv_local),
            ),
            "mlp.gate_up_proj": (
                FusedPart("gate_proj", inter, *self.intermediate),
                FusedPart("up_proj", inter, *self.intermediate),
            ),
        }

    def plan(self, num_layers: int, tied: bool) -> ShardPlan:
        """The slice of every sharded checkpoint tensor this rank reads."""
        p = self.parallel
        if p.world_size == 1:
            return ShardPlan()
        d = self.head_dim
        q = (self.heads[0] * d, self.heads[1] * d)
        kv = (self.kv_heads[0] * d, self.kv_heads[1] * d)
        by_suffix = {
            "self_attn.q_proj": (0, q, True),
            "self_attn.k_proj": (0, kv, True),
            "self_attn.v_proj": (0, kv, True),
            "self_attn.o_proj": (1, q, False),
            "mlp.gate_proj": (0, self.intermediate, True),
            "mlp.up_proj": (0, self.intermediate, True),
            "mlp.down_proj": (1, self.intermediate, False),
        }
        slices: dict[str, TensorSlice] = {}
        for i in range(num_layers):
            for suffix, (dim, (start, stop), split_bias) in by_suffix.items():
                slices[f"model.layers.{i}.{suffix}.weight"] = TensorSlice(dim, start, stop)
                if split_bias:  # a row-parallel bias is read whole, added after the reduce
                    slices[f"model.layers.{i}.{suffix}.bias"] = TensorSlice(0, start, stop)
        vocab = TensorSlice(0, *self.vocab)
        slices["model.embed_tokens.weight"] = vocab
        if not tied:
            slices["lm_head.weight"] = vocab
        return ShardPlan(p.rank, p.world_size, slices)


def _require(ok: bool, world_size: int, why: str) -> None:
    if not ok:
        raise ValueError(f"`tensor_parallel_size` {world_size} cannot split this model: {why}")
