"""The Qwen2-VL and Qwen2.5-VL vision towers: a ViT over dynamic-resolution patch grids, merged
2x2 into the text model's width.

Images and videos arrive as flat patches ``[N, C * T * P * P]`` (the processor's layout, see
``ferrollm.multimodal.qwen2_vl``) with one ``(t, h, w)`` grid per item. A 3-D convolution
(``temporal_patch_size`` frames x ``patch_size``^2 pixels) embeds each patch; blocks of
pre-norm attention (2-D rotary over each patch's row and column) and a quick-GELU MLP follow,
attention confined to one frame of one item (``cu_seqlens``); the merger folds each 2x2 block
of neighbouring patches (adjacent in the flat layout) into one text-width token. Parameter names
follow the checkpoint's ``visual.*`` tensors, so loading is a prefix strip.

Qwen2.5-VL's tower is the same skeleton with RMSNorm for LayerNorm, a gated SiLU MLP
(``gate_proj`` / ``up_proj`` / ``down_proj``, with biases) and window attention: outside
``fullatt_block_indexes`` a patch attends only within its window of ``window_size`` pixels a side
(whole merged tokens, the windows tiling each frame from its top-left corner). The patches are
reordered window by window once, before the blocks (a frame's patches stay inside the frame, so
per-frame attention is unchanged by it), and the merged tokens are put back in order at the end.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise, product
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ferrollm.layers.norm import RMSNorm
from ferrollm.models.config_fields import UnsupportedModelError, positive_int
from ferrollm.models.encoder_checkpoint import encoder_tensors, refuse_missing
from ferrollm.models.qwen2_vl_text import QWEN2_5_VL_MODEL_TYPE

#: transformers' Qwen2_5_VLVisionConfig defaults for the fields a Qwen2.5-VL config omits.
_QWEN2_5_DEFAULTS: Mapping[str, Any] = {
    "depth": 32,
    "hidden_size": 3584,
    "intermediate_size": 3420,
    "num_heads": 16,
    "out_hidden_size": 3584,
    "window_size": 112,
    "fullatt_block_indexes": (7, 15, 23, 31),
    "tokens_per_second": 4,
}


@dataclass(frozen=True)
class Qwen2VLVisionConfig:
    """``vision_config`` of a Qwen2-VL or Qwen2.5-VL ``config.json`` (transformers' defaults
    fill gaps). ``embed_dim`` is the tower's width and ``hidden_size`` the text model's (what
    Qwen2.5-VL calls ``hidden_size`` and ``out_hidden_size``)."""

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
    #: Qwen2.5-VL's tower (RMSNorm, gated SiLU MLP of ``intermediate_size``, window attention
    #: of ``window_size`` pixels outside ``fullatt_block_indexes``); its video positions turn
    #: ``tokens_per_second`` per second of video.
    qwen2_5: bool = False
    intermediate_size: int = 0
    window_size: int = 0
    fullatt_block_indexes: tuple[int, ...] = ()
    tokens_per_second: int = 0

    @classmethod
    def from_hf_dict(cls, config: Mapping[str, Any]) -> Qwen2VLVisionConfig:
        """From the whole ``config.json`` dict; UnsupportedModelError for what it cannot run."""
        raw = config.get("vision_config")
        if not isinstance(raw, Mapping):
            raise UnsupportedModelError("config.json: `vision_config` must be an object")
        qwen2_5 = config.get("model_type") == QWEN2_5_VL_MODEL_TYPE
        want = "silu" if qwen2_5 else "quick_gelu"
        act = raw.get("hidden_act", want)
        if act != want:
            raise UnsupportedModelError(
                f"config.json: `vision_config.hidden_act` {act!r} is not supported ({want})"
            )
        rope = raw.get("rope_parameters") or {}
        fields = _qwen2_5_fields(raw) if qwen2_5 else raw
        fields = {
            k: fields[k] for k in cls.__dataclass_fields__ if k in fields and k != "rope_theta"
        }
        out = cls(**fields, rope_theta=float(rope.get("rope_theta", 10000.0)))
        if out.embed_dim % out.num_heads or (out.embed_dim // out.num_heads) % 4:
            raise UnsupportedModelError(
                "config.json: `vision_config.embed_dim / num_heads` must be a multiple of 4"
            )
        if qwen2_5 and out.window_units < 1:
            raise UnsupportedModelError(
                "config.json: `vision_config.window_size` must be at least `patch_size * "
                f"spatial_merge_size` ({out.patch_size * out.spatial_merge_size}) pixels"
            )
        return out

    @property
    def window_units(self) -> int:
        """Merged tokens along a window's side (transformers' rounding down)."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    @property
    def full_attention_blocks(self) -> frozenset[int]:
        """The blocks that attend over whole frames (all of Qwen2-VL's)."""
        return frozenset(self.fullatt_block_indexes if self.qwen2_5 else range(self.depth))

    @property
    def patch_dim(self) -> int:
        """Values per flat patch: channels x frames x pixels."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


def _qwen2_5_fields(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A Qwen2.5-VL ``vision_config`` in `Qwen2VLVisionConfig`'s field names."""
    where = "vision_config."
    merged = {**_QWEN2_5_DEFAULTS, **raw}
    full = merged["fullatt_block_indexes"]
    if not isinstance(full, (list, tuple)) or not all(isinstance(i, int) for i in full):
        raise UnsupportedModelError(
            f"config.json: `{where}fullatt_block_indexes` must list block indexes; got {full!r}"
        )
    return {
        **{k: v for k, v in merged.items() if k not in ("hidden_size", "out_hidden_size")},
        "embed_dim": positive_int(merged, "hidden_size", where),
        "hidden_size": positive_int(merged, "out_hidden_size", where),
        "intermediate_size": positive_int(merged, "intermediate_size", where),
        "window_size": positive_int(merged, "window_size", where),
        "tokens_per_second": positive_int(merged, "tokens_per_second", where),
        "fullatt_block_indexes": tuple(full),
        "qwen2_5": True,
    }


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
        out: torch.Tensor = self.proj(_segment_attention(q, k, v, bounds).reshape(n, -1))
        return out


def _segment_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int]
) -> torch.Tensor:
    """``[n, heads, head_dim]`` attention within each segment ``[bounds[i], bounds[i + 1])``
    (a frame of an item, or a window of one), no mask. Segments of one length go through one
    batched call: an image's windows are mostly one size, and a call per window would be
    thousands of small kernels for a large image on a GPU."""
    by_length: dict[int, list[int]] = {}
    for start, end in pairwise(bounds):
        if end > start:
            by_length.setdefault(end - start, []).append(start)
    if len(by_length) == 1 and len(next(iter(by_length.values()))) == 1:
        # One segment: [heads, len, head_dim] as it is.
        qs, ks, vs = (t.transpose(0, 1) for t in (q, k, v))
        return F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1)
    out = torch.empty_like(q)
    heads, dim = q.shape[1:]
    for length, starts in by_length.items():
        first = torch.tensor(starts, device=q.device)[:, None]
        rows = (first + torch.arange(length, device=q.device)).flatten()
        # [segments, heads, len, head_dim]
        qs, ks, vs = (
            t.index_select(0, rows).view(len(starts), length, heads, dim).transpose(1, 2)
            for t in (q, k, v)
        )
        o = F.scaled_dot_product_attention(qs, ks, vs).transpose(1, 2).reshape(-1, heads, dim)
        out.index_copy_(0, rows, o)
    return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rope in float32 (as the reference does), back in ``x``'s dtype."""
    xf = x.float()
    half = xf.shape[-1] // 2
    turned = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None] + turned * sin[:, None]).to(x.dtype)


def _norm(config: Qwen2VLVisionConfig) -> nn.Module:
    """The tower's norm over ``embed_dim``: RMSNorm in Qwen2.5-VL, LayerNorm in Qwen2-VL."""
    if config.qwen2_5:
        return RMSNorm(config.embed_dim, eps=1e-6)
    return nn.LayerNorm(config.embed_dim, eps=1e-6)


class _Block(nn.Module):
    def __init__(self, config: Qwen2VLVisionConfig) -> None:
        super().__init__()
        dim = config.embed_dim
        self.norm1 = _norm(config)
        self.norm2 = _norm(config)
        self.attn = _Attention(dim, config.num_heads)
        self.mlp: nn.Module
        if config.qwen2_5:
            self.mlp = _GatedMlp(dim, config.intermediate_size)
        else:
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


class _GatedMlp(nn.Module):
    """Qwen2.5-VL's MLP: ``down(silu(gate(x)) * up(x))``, every projection with a bias."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden)
        self.up_proj = nn.Linear(dim, hidden)
        self.down_proj = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
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
        self.ln_q = _norm(config)
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
        c = self.config
        grids = [tuple(int(v) for v in row) for row in grid_thw.tolist()]
        x = self.patch_embed(pixel_values)
        cos, sin = self._rope(grids, x.device)
        bounds = [0]
        for t, h, w in grids:
            bounds += [bounds[-1] + h * w * (i + 1) for i in range(t)]
        windows, order = bounds, None
        if c.qwen2_5:
            order, windows = window_order(grids, c.spatial_merge_size, c.window_units)
            order = order.to(x.device)
            unit = c.spatial_merge_size**2
            x, cos, sin = (
                v.view(-1, unit, v.shape[-1])[order].flatten(0, 1) for v in (x, cos, sin)
            )
        full = c.full_attention_blocks
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, bounds if i in full else windows)
        merged = self.merger(x)
        if order is not None:  # back to each item's row-major merged order
            merged = merged[torch.argsort(order)]
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


def window_order(
    grids: list[tuple[int, ...]], merge: int, side: int
) -> tuple[torch.Tensor, list[int]]:
    """Qwen2.5-VL's window layout: the merged tokens of all items ``grids`` in window order
    (each item's frames in turn, each frame's windows of ``side`` x ``side`` merged tokens row
    by row, clipped at the frame's edge, and row-major inside a window), as indices into their
    flat order; and the windows' bounds in patches (``merge``^2 a merged token)."""
    order, bounds, base = [], [0], 0
    for t, h, w in grids:
        rows, cols = h // merge, w // merge
        units = torch.arange(base, base + t * rows * cols).view(t, rows, cols)
        for frame, top, left in product(range(t), range(0, rows, side), range(0, cols, side)):
            window = units[frame, top : top + side, left : left + side].flatten()
            order.append(window)
            bounds.append(bounds[-1] + window.numel() * merge**2)
        base += t * rows * cols
    return torch.cat(order), bounds


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
    """The tower of the Qwen2-VL or Qwen2.5-VL checkpoint in ``directory`` on ``device`` in
    ``dtype``; with ``dummy`` random weights (``load_format`` dummy reads no tensor)."""
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
