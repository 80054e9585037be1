"""Single-file GGUF checkpoints (llama.cpp), dequantized tensor by tensor.

The config, tokenizer and chat template are rebuilt from the file's metadata the way
transformers' GGUF integration rebuilds them, and tensors are renamed to transformers' names, so
a GGUF loads into the same model as the Hugging Face checkpoint it was converted from.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ferrollm.distributed.shard_plan import WHOLE, ShardPlan
from ferrollm.executor import gguf_chatglm, gguf_deepseek, gguf_glm4, gguf_phi3
from ferrollm.executor.chat_templates import builtin_chat_template
from ferrollm.executor.gguf_config import OFFSET_NORM_ARCHITECTURES, hf_config_from_gguf
from ferrollm.executor.gguf_reader import GGUFFile, GGUFTensor
from ferrollm.executor.gguf_tokenizer import (
    add_bos_token,
    build_tokenizer_json,
    special_token,
    special_token_id,
)
from ferrollm.executor.source import ModelSource, SpecialTokens
from ferrollm.models.config import ModelConfig
from ferrollm.progress import counted

if TYPE_CHECKING:  # opening a file (config, tokenizer) needs no torch: `ferrollm.preflight`
    import torch

    from ferrollm.layers.ggml_linear import GgmlBlocks
    from ferrollm.layers.linear import Weight

logger = logging.getLogger(__name__)

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
#: llama.cpp's stacked experts ``[num_experts, rows, cols]`` -> each expert's projection.
_EXPERT_TENSORS = {
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_down_exps": "down_proj",
}
#: Routers stay dense under ``keep_quantized`` (`ferrollm.models.moe`).
_ROUTERS = (".mlp.gate.weight", ".mlp.shared_expert_gate.weight")
#: Per architecture, layer tensors named otherwise: Gemma's ``ffn_norm`` is the norm before the
#: MLP, and it has a norm after each block besides.
_GEMMA_LAYER_TENSORS = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_ARCH_LAYER_TENSORS: Mapping[str, Mapping[str, str | None]] = {
    "gemma2": _GEMMA_LAYER_TENSORS,
    "gemma3": _GEMMA_LAYER_TENSORS,
    "phi3": gguf_phi3.PHI3_LAYER_TENSORS,
    "glm4": gguf_glm4.GLM4_LAYER_TENSORS,
    "deepseek2": gguf_deepseek.DEEPSEEK2_LAYER_TENSORS,
    "chatglm": gguf_chatglm.CHATGLM_LAYER_TENSORS,
}
#: Types stored as plain floats (no quantization to keep).
_DENSE_TYPES = frozenset(["F32", "F16", "BF16", "F64"])
#: A tensor's rows: a dense array, or a quantized tensor (whose rows reorder the same way).
_Rows = TypeVar("_Rows", "np.ndarray[Any, Any]", "GgmlBlocks")
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
#: Tensors with no transformers counterpart: llama.cpp's precomputed llama3 rope factors;
#: long rope's factors, which are config values (`rope_factor_lists`).
_IGNORED_TENSORS = frozenset(["rope_freqs.weight", *gguf_phi3.ROPE_FACTOR_TENSORS])


class GGUFCheckpoint(ModelSource):
    """A ``.gguf`` file; its tensors are memory-mapped and dequantized one at a time, or kept
    in their blocks (``keep_quantized``)."""

    def __init__(self, path: Path, file: GGUFFile, **fields: Any) -> None:
        super().__init__(path, **fields)
        self._file = file
        self._arch = str(file.metadata.get("general.architecture"))

    @classmethod
    def open(cls, path: Path) -> GGUFCheckpoint:
        """Parse ``path``'s metadata and rebuild its config and tokenizer."""
        file = GGUFFile(path)  # memory-mapped; no tensor data is read yet
        meta = file.metadata
        tensor_names = [tensor.name for tensor in file.tensors]
        return cls(
            path,
            file,
            config=ModelConfig.from_hf_dict(
                hf_config_from_gguf(meta, tensor_names, gguf_phi3.rope_factor_lists(file))
            ),
            tokenizer_json=build_tokenizer_json(meta),
            chat_template=meta.get("tokenizer.chat_template") or builtin_chat_template(meta),
            special_tokens=_special_tokens(meta),
        )

    @property
    def is_quantized(self) -> bool:
        """Whether any weight matrix is stored in a quantized ggml type."""
        from gguf import GGMLQuantizationType

        return any(
            len(t.shape) >= 2 and GGMLQuantizationType(t.ggml_type).name not in _DENSE_TYPES
            for t in self._file.tensors
        )

    def iter_weights(
        self, dtype: torch.dtype, keep_quantized: bool = False, shard: ShardPlan = WHOLE
    ) -> Iterator[tuple[str, Weight]]:
        """See `ModelSource.iter_weights`.

        A slice reads only its bytes of the memory map (`_sliced`): a row range is one
        contiguous run of blocks, a column range a run of blocks in every row.

        Dense: each tensor is dequantized to float32, then cast. ``keep_quantized``: matrices
        in a type the block kernels read (``ggml_linear.block_types``: Q4_0..Q8_0, Q4_K, Q5_K,
        Q6_K) come as their own blocks, views of the memory map (`_blocks`); other quantized
        types are dequantized and quantized again into the nearest block type (Q4_1 up to 4.5
        bits per weight, else Q8_0), said once in the log.
        """
        import torch

        from ferrollm.layers.ggml_linear import block_types, quantize_dense

        try:
            from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize
        except ImportError as err:  # optional: only GGUF files need it
            raise ImportError("loading .gguf weights needs the `gguf` package") from err

        num_parts = sum(
            len(split) if (split := self._split(t)) else _num_parts(t) for t in self._file.tensors
        )
        requantized: dict[str, str] = {}
        with counted(num_parts, "Loading weights", "tensor") as tick:
            for tensor, name, data, columns in self._parts(shard, keep_quantized):
                tick()
                kind = GGMLQuantizationType(tensor.ggml_type)
                self.num_bytes_read += data.nbytes
                keep = keep_quantized and not name.endswith(_ROUTERS)
                if keep and tensor.ggml_type in block_types():
                    yield name, self._unpermuted(tensor, _blocks(data, tensor.ggml_type))
                    continue
                array = dequantize(data, kind)
                if columns is not None:
                    array = array[:, columns]
                array = self._unpermuted(tensor, array)
                if self._arch in OFFSET_NORM_ARCHITECTURES and name.endswith("norm.weight"):
                    array = array - 1.0  # back to transformers' offset from one
                if not array.flags.writeable:  # F32 comes back as a view of the memory map
                    array = array.copy()
                weight = torch.from_numpy(array)
                if keep and kind.name not in _DENSE_TYPES and weight.dim() == 2:
                    block, size = GGML_QUANT_SIZES[kind]
                    scheme = "int4" if size * 8 / block <= 4.5 else "int8"
                    blocks = quantize_dense(weight, scheme)
                    if blocks is not None:
                        requantized[kind.name] = blocks.name
                        yield name, blocks
                        continue
                yield name, weight.to(dtype)
        for kind_name, scheme in requantized.items():
            logger.info(
                "GGUF %s tensors have no block kernel: dequantized and quantized again to %s",
                kind_name,
                scheme,
            )

    def _parts(
        self, shard: ShardPlan, keep_quantized: bool
    ) -> Iterator[tuple[GGUFTensor, str, np.ndarray[Any, Any], slice | None]]:
        """Each tensor (or, of a stacked ``[experts, rows, cols]`` one, each expert's matrix, a
        contiguous run of its bytes) with its transformers name, its bytes (`_sliced`) and the
        columns to keep of their dequantization. Unused tensors are skipped; a fused q/k/v is
        split into its projections (`_split`), each a run of its rows."""
        for tensor in self._file.tensors:
            split = self._split(tensor)
            if split is not None:
                data = self._file.data(tensor)
                for part_name, start, stop in split:
                    part = shard.slice_of(part_name)  # q/k/v: a range of rows, if any
                    if part is not None:
                        start, stop = start + part.start, start + part.stop
                    yield tensor, part_name, data[start:stop], None
                continue
            experts = _expert_names(tensor.name)
            if experts is None:
                name = hf_tensor_name(tensor.name, self._arch)
                if name is not None:  # None: known and unused
                    yield tensor, name, *self._sliced(tensor, name, shard, keep_quantized)
                continue
            # The plan slices each expert's matrix (its name's), one of llama.cpp's stack.
            stack = self._file.data(tensor)
            for e in range(tensor.shape[0]):
                name = experts.format(e)
                yield tensor, name, *self._sliced(tensor, name, shard, keep_quantized, stack[e])
        if self._arch == "deepseek2":  # its split kv_b_proj halves, joined
            yield from gguf_deepseek.kv_b_parts(self._file, shard)

    def _sliced(
        self,
        tensor: GGUFTensor,
        name: str,
        shard: ShardPlan,
        keep_quantized: bool,
        data: np.ndarray[Any, Any] | None = None,
    ) -> tuple[np.ndarray[Any, Any], slice | None]:
        """``tensor``'s bytes (or ``data``, one expert's matrix of a stacked tensor) for
        ``shard``'s slice of matrix ``name``, and the columns to keep of their dequantization
        (None: all) when the slice starts or ends inside a block."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        from ferrollm.layers.ggml_linear import block_types

        if data is None:
            data = self._file.data(tensor)
        part = shard.slice_of(name)
        if part is None:
            return data, None
        if part.dim == 0:
            return data[part.start : part.stop], None
        kind = GGMLQuantizationType(tensor.ggml_type)
        if kind.name in _DENSE_TYPES:  # plain floats: one element per value
            return data[:, part.start : part.stop], None
        block, block_bytes = GGML_QUANT_SIZES[kind]
        first, last = part.start // block, -(-part.stop // block)
        columns: slice | None = None
        if part.start % block != 0 or part.stop % block != 0:
            columns = slice(part.start - first * block, part.stop - first * block)
        if columns is not None and keep_quantized and tensor.ggml_type in block_types():
            raise shard.refusal(
                name,
                f"rank {shard.rank}'s input columns [{part.start}, {part.stop}) cut through "
                f"its {kind.name} blocks of {block} values",
            )
        return np.ascontiguousarray(data[:, first * block_bytes : last * block_bytes]), columns

    def _split(self, tensor: GGUFTensor) -> list[tuple[str, int, int]] | None:
        """A "chatglm" file's fused ``attn_qkv`` as (q/k/v name, first row, end row); None
        for any other tensor (`gguf_chatglm.qkv_rows`)."""
        if self._arch != "chatglm":
            return None
        config = self.config
        return gguf_chatglm.qkv_rows(
            tensor.name,
            tensor.shape[0],
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )

    def _unpermuted(self, tensor: GGUFTensor, array: _Rows) -> _Rows:
        # llama.cpp's converter interleaves the rotary halves of Llama's q/k rows (it uses
        # GPT-J-style rope there); transformers uses NeoX-style halves, so undo it. Qwen files
        # are written unpermuted. The interleave stays within each head, so a slice of whole
        # heads undoes it with its own head count.
        if self.config.model_type not in ("llama", "mixtral"):  # Mixtral: a "llama" file
            return array
        share = array.shape[0] / tensor.shape[0]
        if ".attn_q." in tensor.name:
            return _reverse_permute(array, round(self.config.num_attention_heads * share))
        if ".attn_k." in tensor.name:
            return _reverse_permute(array, round(self.config.num_key_value_heads * share))
        return array


def _blocks(data: np.ndarray[Any, Any], ggml_type: int) -> GgmlBlocks:
    """A quantized matrix's bytes ``[rows, row_bytes]`` as `GgmlBlocks`, without a copy: the
    tensor views the memory map (read-only; nothing ever writes to it)."""
    import warnings

    import torch

    from ferrollm.layers.ggml_linear import GgmlBlocks, block_types

    _, values, size = block_types()[ggml_type]
    with warnings.catch_warnings():  # torch warns that the array is not writable
        warnings.simplefilter("ignore", UserWarning)
        rows = torch.from_numpy(data)
    return GgmlBlocks(rows, ggml_type, data.shape[1] // size * values)


def _num_parts(tensor: GGUFTensor) -> int:
    """The load steps of ``tensor``: one per expert of a stacked one, none for the half of a
    DeepSeek kv_b that its other half brings (`gguf_deepseek.kv_b_parts`), else one."""
    if _expert_names(tensor.name):
        return tensor.shape[0]
    match = _LAYER_NAME.fullmatch(tensor.name)
    return 0 if match is not None and match[2] == gguf_deepseek.JOINED_HALF else 1


def _expert_names(gguf_name: str) -> str | None:
    """``"model.layers.N.mlp.experts.{}.<proj>.weight"`` for a stacked expert tensor of layer N
    (format it with the expert's index), None for any other tensor."""
    match = _LAYER_NAME.fullmatch(gguf_name)
    if match is None or match[2] not in _EXPERT_TENSORS:
        return None
    return f"model.layers.{match[1]}.mlp.experts.{{}}.{_EXPERT_TENSORS[match[2]]}.{match[3]}"


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The transformers name of a GGUF tensor of a ``general.architecture`` ``arch`` file, or
    None for one ferrollm ignores.

    Raises ValueError for a tensor it does not know, rather than load a model without it.
    """
    if gguf_name in _IGNORED_TENSORS:
        return None
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[stem]}.{suffix}"
    match = _LAYER_NAME.fullmatch(gguf_name)
    names = {**_LAYER_TENSORS, **_ARCH_LAYER_TENSORS.get(arch, {})}
    if match is None or match[2] not in names:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no known transformers name")
    name = names[match[2]]
    if name is None:  # read with another tensor (its family's module)
        return None
    # A name ending in "_" is a parameter of its own: the suffix joins it without a dot.
    return f"model.layers.{match[1]}.{name}{'' if name.endswith('_') else '.'}{match[3]}"


def _reverse_permute(array: _Rows, num_heads: int) -> _Rows:
    """Undo llama.cpp's rotary row interleave, on a dense array or a quantized tensor's rows."""
    rows = array.shape[0]
    half = rows // num_heads // 2
    order = np.arange(rows).reshape(num_heads, half, 2).swapaxes(2, 1).reshape(-1)
    if not isinstance(array, np.ndarray):  # GgmlBlocks: reorder its rows with torch
        import torch

        # The reordered copy is read only by the layer it is loaded into: owned, so that
        # layer interleaves it in place rather than holding it twice.
        return dataclasses.replace(array.rows(torch.from_numpy(order)), owned=True)
    return array[order]  # type: ignore[no-any-return]


def _special_tokens(meta: Mapping[str, Any]) -> SpecialTokens:
    return SpecialTokens(
        bos_token=special_token(meta, "bos_token_id"),
        eos_token=special_token(meta, "eos_token_id"),
        pad_token=special_token(meta, "padding_token_id"),
        unk_token=special_token(meta, "unknown_token_id"),
        bos_token_id=special_token_id(meta, "bos_token_id"),
        eos_token_id=special_token_id(meta, "eos_token_id"),
        pad_token_id=special_token_id(meta, "padding_token_id"),
        add_bos_token=add_bos_token(meta),
    )
