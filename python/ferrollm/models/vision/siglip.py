"""A SigLIP vision transformer that takes images of any size up to its own, as Idefics3 runs it.

Plain SigLIP embeds a fixed-size square image: patch ``i`` gets position ``i``. Idefics3 (after
NaViT, "Patch n' Pack") feeds it tiles that may be smaller than ``image_size`` and padded up to
the batch's largest: a ``patch_mask`` marks the real patches, and each real patch's position is
looked up by where it sits *relative to the real area* — its fractional row and column are
bucketed into the ``patches_per_side`` grid the position table was trained on, so a half-size
image is spread over the whole table rather than squeezed into its corner. Padded patches take
position 0 and are masked out as attention keys; they are still computed (and leave the
encoder), because the connector's pixel shuffle needs the full grid.

For a full-size image the buckets are exactly ``0 .. patches_per_side² - 1``: plain SigLIP.

Layers are pre-LayerNorm: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``; bidirectional
attention (``F.scaled_dot_product_attention``) with q/k/v fused into one projection, since an
image's patches all go through together. Module names follow the checkpoint's so that loading
is a rename of q/k/v only (``ferrollm.models.vision.idefics3``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ferrollm.layers.activation import ACTIVATIONS
from ferrollm.models.vision.config import SiglipConfig


def bucketed_position_ids(patch_mask: torch.Tensor, patches_per_side: int) -> torch.Tensor:
    """Each patch's position id ``[N, rows * cols]`` for a ``patch_mask [N, rows, cols]`` (bool).

    An image's real extent is read from its mask's first column (rows) and first row (columns),
    as the processor pads only at the bottom and right. A real patch at row ``r`` of ``R`` real
    rows sits at fraction ``r / R`` of the image; that fraction's bucket among the table's
    ``patches_per_side`` equal steps is its row in the table (likewise for columns). The
    fractions are computed in float32 whatever the model's dtype, so bucket edges agree with
    the reference implementation's.
    """
    count, rows, cols = patch_mask.shape
    device = patch_mask.device
    step = 1.0 / patches_per_side
    # Upper edges of all but the last bucket, built as an arithmetic range (so in float32 the
    # edges round exactly as the reference implementation's do).
    edges = torch.arange(step, 1.0, step, device=device)
    real_rows = patch_mask[:, :, 0].sum(dim=1).to(torch.float32)
    real_cols = patch_mask[:, 0, :].sum(dim=1).to(torch.float32)

    def buckets(real: torch.Tensor, length: int) -> torch.Tensor:
        index = torch.arange(length, device=device, dtype=torch.float32)
        fraction = (index[None, :] * (1.0 / real)[:, None]).clamp(max=1.0 - 1e-6)
        return torch.bucketize(fraction, edges, right=True)

    ids = (
        buckets(real_rows, rows)[:, :, None] * patches_per_side + buckets(real_cols, cols)[:, None]
    )
    return torch.where(patch_mask, ids, 0).reshape(count, rows * cols)


class SiglipEmbeddings(nn.Module):
    """Patch embedding (a stride-``patch_size`` convolution) plus bucketed positions."""

    def __init__(self, config: SiglipConfig) -> None:
        super().__init__()
        self.patches_per_side = config.patches_per_side
        self.patch_embedding = nn.Conv2d(
            config.num_channels,
            config.hidden_size,
            kernel_size=config.patch_size,
            stride=config.patch_size,
        )
        self.position_embedding = nn.Embedding(config.patches_per_side**2, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor, patch_mask: torch.Tensor) -> torch.Tensor:
        """``pixel_values [N, C, H, W]``, ``patch_mask [N, H // p, W // p]`` -> ``[N, S, h]``
        with ``S = (H // p) * (W // p)`` in row-major patch order."""
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        positions = bucketed_position_ids(patch_mask, self.patches_per_side)
        out: torch.Tensor = patches + self.position_embedding(positions)
        return out


class SiglipAttention(nn.Module):
    """Bidirectional multi-head self-attention; q, k and v are one matmul."""

    def __init__(self, config: SiglipConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.qkv_proj = nn.Linear(h, 3 * h)
        self.out_proj = nn.Linear(h, h)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """``x [N, S, h]``; ``key_mask [N, 1, 1, S]`` (True: attend to that patch) or None."""
        n, s, h = x.shape
        q, k, v = (
            self.qkv_proj(x).view(n, s, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        )
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        projected: torch.Tensor = self.out_proj(out.transpose(1, 2).reshape(n, s, h))
        return projected


class SiglipMLP(nn.Module):
    """``fc2(act(fc1(x)))`` with the config's activation (``gelu_pytorch_tanh`` for SigLIP)."""

    def __init__(self, config: SiglipConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., h]`` -> ``[..., h]``."""
        out: torch.Tensor = self.fc2(self.act(self.fc1(x)))
        return out


class SiglipEncoderLayer(nn.Module):
    """One pre-LayerNorm block: attention, then MLP, each added to the residual stream."""

    def __init__(self, config: SiglipConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = SiglipAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = SiglipMLP(config)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """``x [N, S, h]`` -> ``[N, S, h]``."""
        x = x + self.self_attn(self.layer_norm1(x), key_mask)
        out: torch.Tensor = x + self.mlp(self.layer_norm2(x))
        return out


class SiglipEncoder(nn.Module):
    """The stack of encoder layers (a module of its own to keep the checkpoint's names)."""

    def __init__(self, config: SiglipConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            SiglipEncoderLayer(config) for _ in range(config.num_hidden_layers)
        )

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """``x [N, S, h]`` -> ``[N, S, h]``."""
        for layer in self.layers:
            x = layer(x, key_mask)
        return x


class SiglipVisionTransformer(nn.Module):
    """Embeddings, encoder, post-LayerNorm: ``forward(pixel_values, patch_mask)`` -> the last
    hidden states of every patch, padded ones included, ``[N, S, hidden_size]``."""

    def __init__(self, config: SiglipConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = SiglipEmbeddings(config)
        self.encoder = SiglipEncoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self, pixel_values: torch.Tensor, patch_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``pixel_values [N, C, H, W]``; ``patch_mask [N, H // p, W // p]`` bool (None: all
        patches real)."""
        n, _, height, width = pixel_values.shape
        p = self.config.patch_size
        if patch_mask is None:
            patch_mask = torch.ones(
                n, height // p, width // p, dtype=torch.bool, device=pixel_values.device
            )
        x = self.embeddings(pixel_values, patch_mask)
        # Padded patches are never attended to; with none, no mask (the faster kernel).
        key_mask = None if bool(patch_mask.all()) else patch_mask.reshape(n, 1, 1, -1)
        out: torch.Tensor = self.post_layernorm(self.encoder(x, key_mask))
        return out
