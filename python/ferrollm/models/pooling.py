"""From packed hidden states to one vector per input: the pooling a checkpoint asks for.

A sentence-transformers directory says it in ``modules.json`` (a ``Pooling`` module with its
``1_Pooling/config.json``, an optional ``Normalize``) and ``sentence_bert_config.json``
(``max_seq_length``); a plain Hugging Face directory says nothing, so the caller chooses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ferrollm.models.config import UnsupportedModelError

#: Pooling modes ferrollm runs: mean over the input's tokens, its first token (CLS), its last
#: token (decoder embedders), or the per-dimension max.
POOLING_MODES = ("mean", "cls", "last", "max")

# sentence-transformers' Pooling config keys -> our mode names.
_ST_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_max_tokens": "max",
}
_ST_UNSUPPORTED = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")


@dataclass(frozen=True)
class EmbedSpec:
    """How a model's hidden states become embeddings."""

    pooling: str
    normalize: bool
    #: The longest input (tokens, specials included); None: the model's own limit.
    max_seq_length: int | None = None
    #: The sentence-transformers layout's encoder subfolder ("" = the directory itself).
    transformer_path: str = ""


def read_sentence_transformers(path: Path) -> EmbedSpec | None:
    """The spec a sentence-transformers directory declares, or None when it is not one."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    kinds = {str(m["type"]).rsplit(".", 1)[-1]: m for m in modules}
    unknown = set(kinds) - {"Transformer", "Pooling", "Normalize"}
    if unknown:
        raise UnsupportedModelError(
            f"sentence-transformers modules {sorted(unknown)} are not supported "
            "(only Transformer, Pooling and Normalize)"
        )
    if "Transformer" not in kinds or "Pooling" not in kinds:
        raise UnsupportedModelError("modules.json must list a Transformer and a Pooling module")
    pooling = _st_pooling(path / kinds["Pooling"]["path"] / "config.json")
    max_len = None
    st_config = path / kinds["Transformer"]["path"] / "sentence_bert_config.json"
    if st_config.is_file():
        max_len = json.loads(st_config.read_text()).get("max_seq_length")
    return EmbedSpec(
        pooling=pooling,
        normalize="Normalize" in kinds,
        max_seq_length=int(max_len) if max_len is not None else None,
        transformer_path=str(kinds["Transformer"]["path"]),
    )


def _st_pooling(config_file: Path) -> str:
    config = json.loads(config_file.read_text())
    bad = [k for k in _ST_UNSUPPORTED if config.get(k)]
    if bad:
        raise UnsupportedModelError(f"pooling {bad} is not supported; use {POOLING_MODES}")
    if config.get("include_prompt") is False:
        raise UnsupportedModelError("pooling with include_prompt=false is not supported")
    modes = [mode for key, mode in _ST_MODES.items() if config.get(key)]
    if len(modes) != 1:
        raise UnsupportedModelError(
            f"{config_file} must enable exactly one pooling mode; found {modes or 'none'}"
        )
    return modes[0]


def pool(hidden: torch.Tensor, cu_seqlens: torch.Tensor, spec: EmbedSpec) -> torch.Tensor:
    """One float32 vector per packed input ([inputs, hidden]), normalized if ``spec`` says."""
    starts = cu_seqlens[:-1].to(hidden.device)
    ends = cu_seqlens[1:].to(hidden.device)
    if spec.pooling == "cls":
        out = hidden[starts].float()
    elif spec.pooling == "last":
        out = hidden[ends - 1].float()
    elif spec.pooling == "mean":
        lens = ends - starts
        seg = torch.repeat_interleave(torch.arange(len(lens), device=hidden.device), lens)
        sums = torch.zeros(len(lens), hidden.shape[1], device=hidden.device)
        sums.index_add_(0, seg, hidden.float())
        out = sums / lens.unsqueeze(1).float()
    elif spec.pooling == "max":
        rows = zip(starts.tolist(), ends.tolist(), strict=True)
        out = torch.stack([hidden[s:e].float().amax(0) for s, e in rows])
    else:
        raise UnsupportedModelError(f"pooling {spec.pooling!r} is not one of {POOLING_MODES}")
    return F.normalize(out, dim=-1) if spec.normalize else out
