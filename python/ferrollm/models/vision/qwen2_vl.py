"""The Qwen2-VL vision tower: a ViT over dynamic-resolution patch grids, merged 2x2 into the
text model's width.

Images and videos arrive as flat patches ``[N, C * T * P * P]`` (the processor's layout, see
``ferrollm.multimodal.qwen2_vl``) with one ``(t, h, w)`` grid per item. A 3-D convolution
(``temporal_patch_size`` frames x ``patch_size``^2 pixels) embeds each patch; blocks of
pre-norm attention (2-D rotary over each patch's row and column) and a quick-GELU MLP follow,
attention confined to one frame of one item (``cu_seqlens``); the merger folds each 2x2 block
of neighbouring patches (adjacent in the flat layout) into one text-width token. Parameter names
follow the checkpoint's ``visual.*`` tensors, so loading is a prefix strip.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ferrollm.models.config_fields import UnsupportedModelError
from ferrollm.models.encoder_checkpoint import encoder_tensors, refuse_missing


@dataclass(frozen=True)
class Qwen2VLVisionConfig:
    """``vision_config`` of a Qwen2-VL ``config.json`` (transformers' defaults fill gaps)."""

    depth: int = 32
    embed_dim: int = 1280
    hidden_size: int = 3584
    mlp_ratio: float = 4
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    rope_theta: float = 10000.0

    @classmethod
    def from_hf_dict(cls, config: Mapping[str, Any]) -> Qwen2VLVisionConfig:
        """From the whole ``config.json`` dict; UnsupportedModelError for what it cannot run."""
        raw = config.get("vision_config")
        if not isinstance(raw, Mapping):
            raise UnsupportedModelError("config.json: `vision_config` must be an object")
        act = raw.get("hidden_act", "quick_gelu")
        if act != "quick_gelu":
            raise UnsupportedModelError(
                f"config.json: `vision_config.hidden_act` {act!r} is not supported (quick_gelu)"
            )
        rope = raw.get("rope_parameters") or {}
        fields = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        out = cls(**fields, rope_theta=float(rope.get("rope_theta", 10000.0)))
        if out.embed_dim % out.num_heads or (out.embed_dim // out.num_heads) % 4:
            raise UnsupportedModelError(
                "config.json: `vision_config.embed_dim / num_heads` must be a multiple of 4"
            )
        return out

    @property
    def patch_dim(self) -> int:
        """Values per flat patch: channels x frames x pixels."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


class _Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds: list[int]
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.num_heads, -1).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        outs = []
        for start, end in pairwise(bounds):
            # [heads, len, head_dim]: attention within one frame of one item, no mask.
            qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
            outs.append(F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1))
        out: torch.Tensor = self.proj(torch.cat(outs).reshape(n, -1))
        return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rope in float32 (as the reference does), back in ``x``'s dtype."""
    xf = x.float()
    half = xf.shape[-1] // 2
    turned = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None] + turned * sin[:, None]).to(x.dtype)


class _Block(nn.Module):
    def __init__(self, config: Qwen2VLVisionConfig) -> None:
        super().__init__()
        dim = config.embed_dim
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = _Attention(dim, config.num_heads)
        self.mlp = _Mlp(dim, int(dim * config.mlp_ratio))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds: list[int]
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, bounds)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        out: torch.Tensor = self.fc2(h * torch.sigmoid(1.702 * h))  # quick GELU
        return out


class _PatchEmbed(nn.Module):
    def __init__(self, config: Qwen2VLVisionConfig) -> None:
        super().__init__()
        self.config = config
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(
            config.in_channels, config.embed_dim, kernel_size=kernel, stride=kernel, bias=False
        )

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        c = self.config
        x = patches.view(-1, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size)
        return self.proj(x.to(self.proj.weight.dtype)).view(-1, c.embed_dim)  # type: ignore[no-any-return]


class _Merger(nn.Module):
    def __init__(self, config: Qwen2VLVisionConfig) -> None:
        super().__init__()
        self.merged = config.embed_dim * config.spatial_merge_size**2
        self.ln_q = nn.LayerNorm(config.embed_dim, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(self.merged, self.merged),
            nn.GELU(),
            nn.Linear(self.merged, config.hidden_size),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mlp(self.ln_q(x).view(-1, self.merged))
        return out


class Qwen2VLVision(nn.Module):
    """The tower: `features` turns patches and grids into each item's placeholder embeddings."""

    def __init__(self, config: Qwen2VLVisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = _PatchEmbed(config)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.depth))
        self.merger = _Merger(config)
        spatial = config.embed_dim // config.num_heads // 2
        exponents = torch.arange(0, spatial, 2, dtype=torch.float32, device="cpu") / spatial
        #: Frequencies of the 2-D rope (float32, outside ``Module.to``; see `features`).
        self.inv_freq = 1.0 / (config.rope_theta**exponents)

    def tokens_of(self, grid_thw: tuple[int, int, int]) -> int:
        """Merged tokens an item of ``grid_thw`` patches becomes."""
        t, h, w = grid_thw
        return t * h * w // self.config.spatial_merge_size**2

    def features(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> list[torch.Tensor]:
        """``[tokens_of(grid), hidden_size]`` per item of ``grid_thw [items, 3]`` from their
        patches ``pixel_values [sum(t*h*w), patch_dim]``, concatenated in item order."""
        grids = [tuple(int(v) for v in row) for row in grid_thw.tolist()]
        x = self.patch_embed(pixel_values)
        cos, sin = self._rope(grids, x.device)
        bounds = [0]
        for t, h, w in grids:
            bounds += [bounds[-1] + h * w * (i + 1) for i in range(t)]
        for block in self.blocks:
            x = block(x, cos, sin, bounds)
        merged = self.merger(x)
        return list(merged.split([self.tokens_of(g) for g in grids]))  # type: ignore[arg-type]

    def _rope(
        self, grids: list[tuple[int, ...]], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 cos/sin ``[N, head_dim]``: each patch's row angles then column angles (the
        flat layout walks 2x2 merge blocks, so positions follow it)."""
        m = self.config.spatial_merge_size
        rows = []
        for t, h, w in grids:
            hh, ww = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            shape = (h // m, m, w // m, m)
            hh = hh.reshape(shape).transpose(1, 2).flatten()
            ww = ww.reshape(shape).transpose(1, 2).flatten()
            rows.append(torch.stack((hh, ww), dim=-1).repeat(t, 1))
        pos = torch.cat(rows).to(device)
        freqs = pos[..., None].float() * self.inv_freq.to(device)
        hw = torch.cat((freqs[:, 0], freqs[:, 1]), dim=-1)
        emb = torch.cat((hw, hw), dim=-1)
        return emb.cos(), emb.sin()

    def load_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy ``tensors`` (named as this module's parameters) in; ValueError naming an
        unknown, misshapen or missing one."""
        params = dict(self.named_parameters())
        for name, tensor in tensors.items():
            param = params.pop(name, None)
            if param is None or param.shape != tensor.shape:
                raise ValueError(
                    f"vision tensor {name!r}: unknown or of shape {tuple(tensor.shape)}"
                )
            with torch.no_grad():
                param.copy_(tensor)
        refuse_missing("vision", sorted(params))


def checkpoint_visual_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """The tower's tensors of a checkpoint directory (``visual.*``, or transformers 5's
    ``model.visual.*``), named as `Qwen2VLVision`'s parameters."""
    return {
        name.removeprefix("model.").removeprefix("visual."): tensor
        for name, tensor in encoder_tensors(directory, ("visual.",))
    }


def build_qwen2_vl_vision(
    directory: Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    dummy: bool = False,
) -> Qwen2VLVision:
    """The tower of the Qwen2-VL checkpoint in ``directory`` on ``device`` in ``dtype``; with
    ``dummy`` random weights (``load_format`` dummy reads no tensor)."""
    raw = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    with torch.device("meta"):
        model = Qwen2VLVision(Qwen2VLVisionConfig.from_hf_dict(raw))
    model = model.to(dtype=dtype).to_empty(device=device)
    if dummy:
        from ferrollm.executor.dummy_weights import fill_dummy_weights

        fill_dummy_weights(model)
    else:
        model.load_weights(checkpoint_visual_tensors(directory))
    model.eval()
    model.requires_grad_(False)
    return model
