"""BERT-family encoders in plain torch: BERT, RoBERTa and XLM-R (position ids offset past the
padding id), and the MiniLM/BGE/E5 checkpoints that share their shape.

Inputs are packed: one step's token ids are concatenated with no padding, and ``cu_seqlens``
(cumulative lengths, ``[0, len0, len0 + len1, ...]``) says where each input starts. The
linear layers run on all the step's tokens at once; attention runs per input over its own
tokens (no mask, no padding), so a short input never pays for a long one. Nothing is kept
after the forward: an encoder is prefill-only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ferrollm.models.config import UnsupportedModelError

#: ``model_type`` -> whether position ids start after the padding id (RoBERTa's convention).
ENCODER_TYPES: Mapping[str, bool] = {"bert": False, "roberta": True, "xlm-roberta": True}


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


_ACTIVATIONS: Mapping[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "relu": F.relu,
}


@dataclass(frozen=True)
class BertConfig:
    """The validated shape of a BERT-family ``config.json``."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> BertConfig:
        """Raises ``UnsupportedModelError`` naming what ferrollm cannot run."""
        model_type = str(raw.get("model_type", ""))
        if model_type not in ENCODER_TYPES:
            raise UnsupportedModelError(
                f"encoder model_type {model_type!r} is not supported; "
                f"supported: {', '.join(ENCODER_TYPES)}"
            )
        act = str(raw.get("hidden_act", "gelu"))
        if act not in _ACTIVATIONS:
            raise UnsupportedModelError(f"hidden_act {act!r} is not supported for encoders")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise UnsupportedModelError(
                f"position_embedding_type {raw['position_embedding_type']!r} is not supported; "
                "only 'absolute'"
            )
        config = cls(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            hidden_act=act,
            max_position_embeddings=int(raw.get("max_position_embeddings", 512)),
            type_vocab_size=int(raw.get("type_vocab_size", 2)),
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
            pad_token_id=int(raw.get("pad_token_id") or 0),
        )
        if config.hidden_size % config.num_attention_heads:
            raise UnsupportedModelError("hidden_size must be a multiple of num_attention_heads")
        return config

    @property
    def position_offset(self) -> int:
        """The first position id: 0 for BERT, ``pad_token_id + 1`` for RoBERTa/XLM-R."""
        return self.pad_token_id + 1 if ENCODER_TYPES[self.model_type] else 0

    @property
    def max_input_tokens(self) -> int:
        """The longest input the position table covers."""
        return self.max_position_embeddings - self.position_offset


class BertLayer(nn.Module):
    """One post-LayerNorm encoder layer; q, k and v are one fused matmul."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.layer_norm_eps
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        self.qkv = nn.Linear(h, 3 * h)
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=eps)
        self.up = nn.Linear(h, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, h)
        self.out_norm = nn.LayerNorm(h, eps=eps)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor, bounds: list[tuple[int, int]]) -> torch.Tensor:
        q, k, v = self.qkv(x).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        x = self.attn_norm(x + self.attn_out(self._attention(q, k, v, bounds)))
        out: torch.Tensor = self.out_norm(x + self.down(self.act(self.up(x))))
        return out

    def _attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[tuple[int, int]]
    ) -> torch.Tensor:
        # Varlen attention: each input attends to its own tokens only, bidirectionally.
        outs = []
        for start, end in bounds:
            qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
            outs.append(F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1))
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out.reshape(-1, self.num_heads * self.head_dim)


class BertModel(nn.Module):
    """The encoder: ``forward(input_ids, cu_seqlens)`` -> last hidden states ``[tokens, h]``."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, h)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h)
        self.token_type_embeddings = nn.Embedding(max(config.type_vocab_size, 1), h)
        self.embed_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """``input_ids`` [tokens] (int64), ``cu_seqlens`` [inputs + 1] on the CPU."""
        bounds = list(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True))
        positions = packed_positions(cu_seqlens, self.config.position_offset)
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions.to(input_ids.device))
            + self.token_type_embeddings.weight[0]  # one segment: type id 0
        )
        x = self.embed_norm(x)
        for layer in self.layers:
            x = layer(x, bounds)
        out: torch.Tensor = x
        return out


def packed_positions(cu_seqlens: torch.Tensor, offset: int) -> torch.Tensor:
    """Each packed token's position within its own input, plus ``offset``."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    starts = torch.repeat_interleave(cu_seqlens[:-1], lens)
    return torch.arange(int(cu_seqlens[-1]), dtype=torch.int64) - starts + offset


# Hugging Face names -> ours. Prefixes of task heads (``bert.``, ``roberta.``) are stripped
# first; the pooler and any head are not part of the encoder and are skipped.
_RENAMES = (
    (r"^embeddings\.LayerNorm\.(weight|bias|gamma|beta)$", r"embed_norm.\1"),
    (r"^embeddings\.(word|position|token_type)_embeddings\.", r"\1_embeddings."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.attn_out."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.attn_norm."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.up."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.down."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.out_norm."),
)
_QKV = re.compile(r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)$")
_SKIP = re.compile(r"^(pooler|cls|lm_head|classifier)\.|position_ids$")
_PREFIXES = ("bert.", "roberta.", "model.", "0.auto_model.")


def hf_to_local(weights: Iterator[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A Hugging Face BERT/RoBERTa state dict renamed for ``BertModel`` (q/k/v fused)."""
    out: dict[str, torch.Tensor] = {}
    parts: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        for prefix in _PREFIXES:
            name = name.removeprefix(prefix)
        name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))
        if _SKIP.search(name):
            continue
        if (m := _QKV.match(name)) is not None:
            parts.setdefault((m[1], m[3]), {})[m[2]] = tensor
            continue
        for pattern, repl in _RENAMES:
            name, n = re.subn(pattern, repl, name)
            if n:
                break
        else:
            raise UnsupportedModelError(f"unexpected encoder weight {name!r}")
        out[name] = tensor
    for (layer, kind), qkv in parts.items():
        out[f"layers.{layer}.qkv.{kind}"] = torch.cat([qkv["query"], qkv["key"], qkv["value"]])
    return out


def load_bert(path: Path, device: torch.device, dtype: torch.dtype) -> BertModel:
    """A ``BertModel`` from a Hugging Face directory (``config.json`` + safetensors)."""
    from safetensors.torch import load_file

    config = BertConfig.from_dict(json.loads((path / "config.json").read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"{path} has no .safetensors weights")
    weights = hf_to_local(item for f in files for item in load_file(f).items())
    with torch.device("meta"):
        model = BertModel(config)
    model = model.to_empty(device=device)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise UnsupportedModelError(
            f"encoder weights do not match: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    model.to(dtype=dtype).eval()
    model.requires_grad_(False)
    return model
