"""The image side of Idefics3 / SmolVLM: SigLIP encoder, pixel-shuffle connector, weights.

`Idefics3Vision.image_features` turns preprocessed tiles (the processor's ``pixel_values`` and
``pixel_attention_mask``) into ``tokens_per_image`` vectors of the text model's width per tile,
which replace, in order, the embeddings of the prompt's ``<image>`` placeholder tokens.

The connector is what keeps the token count small: the pixel shuffle folds each
``scale_factor`` x ``scale_factor`` block of encoder outputs into one vector (``scale_factor``²
times wider), so a 512-pixel tile of 32 x 32 patches costs 64 text tokens at scale 4, and one
bias-free linear layer maps that into the text model's width.

Weights come from the Hugging Face checkpoint as saved (``model.vision_model.*``,
``model.connector.*``); the text model's tensors are left to the decoder's own loader.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from ferrollm.layers.linear import copy_checked
from ferrollm.models.encoder_checkpoint import encoder_tensors, refuse_missing
from ferrollm.models.vision.config import Idefics3Config
from ferrollm.models.vision.siglip import SiglipVisionTransformer

#: Prefix of every tensor of an ``Idefics3ForConditionalGeneration`` checkpoint's base model
#: (absent when an ``Idefics3Model`` was saved on its own).
_BASE_PREFIX = "model."
#: Checkpoint subtrees (after `_BASE_PREFIX`) this module loads; the rest is the text model's.
_OWN_PREFIXES = ("vision_model.", "connector.")
#: Checkpoint q/k/v projections, stored separately, loaded into rows of ``qkv_proj``.
_QKV = ("q_proj", "k_proj", "v_proj")


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """Fold each ``scale`` x ``scale`` block of a square patch grid into one wider vector.

    ``x [N, side * side, D]`` (row-major patches) -> ``[N, (side / scale)², scale² * D]``; the
    output's token ``(i, j)`` is the block's patches concatenated row by row:
    ``x[i*scale + a, j*scale + b]`` at features ``(a * scale + b) * D ...``.
    """
    n, seq, dim = x.shape
    side = round(seq**0.5)
    if side * side != seq or side % scale:
        raise ValueError(
            f"pixel shuffle needs a square patch grid whose side divides by {scale}; "
            f"got {seq} patches"
        )
    blocks = side // scale
    grid = x.reshape(n, blocks, scale, blocks, scale, dim).permute(0, 1, 3, 2, 4, 5)
    return grid.reshape(n, blocks * blocks, scale * scale * dim)


def patch_mask_of(pixel_mask: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``[N, H, W]`` pixel mask -> ``[N, H // p, W // p]`` bool: a patch is real when any of its
    pixels is (a tile's last row of patches may be only partly image)."""
    n, height, width = pixel_mask.shape
    rows, cols = height // patch_size, width // patch_size
    pixels = pixel_mask[:, : rows * patch_size, : cols * patch_size].bool()
    return pixels.reshape(n, rows, patch_size, cols, patch_size).any(dim=4).any(dim=2)


class ModalityProjection(nn.Module):
    """The connector's one linear layer (no bias), under the checkpoint's name ``proj``."""

    def __init__(self, config: Idefics3Config) -> None:
        super().__init__()
        self.proj = nn.Linear(config.connector_input_size, config.text_hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., scale² * vision hidden]`` -> ``[..., text hidden]``."""
        out: torch.Tensor = self.proj(x)
        return out


class Idefics3Connector(nn.Module):
    """Pixel shuffle by ``scale_factor``, then the modality projection."""

    def __init__(self, config: Idefics3Config) -> None:
        super().__init__()
        self.scale_factor = config.scale_factor
        self.modality_projection = ModalityProjection(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, patches, vision hidden]`` -> ``[N, tokens_per_image, text hidden]``."""
        out: torch.Tensor = self.modality_projection(pixel_shuffle(hidden, self.scale_factor))
        return out


class Idefics3Vision(nn.Module):
    """Encoder and connector of an Idefics3 checkpoint; see `image_features`."""

    def __init__(self, config: Idefics3Config) -> None:
        super().__init__()
        self.config = config
        self.vision_model = SiglipVisionTransformer(config.vision)
        self.connector = Idefics3Connector(config)

    @property
    def tokens_per_image(self) -> int:
        """Feature vectors (``<image>`` tokens) per image tile."""
        return self.config.tokens_per_image

    @property
    def image_token_id(self) -> int:
        """The ``<image>`` placeholder token the features replace."""
        return self.config.image_token_id

    @torch.no_grad()
    def image_features(
        self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The text-width features of each real image tile, in order.

        ``pixel_values``: ``[N, C, H, W]`` float (or the processor's batched
        ``[B, I, C, H, W]``, flattened to ``B * I`` tiles); ``pixel_attention_mask``: ``[N, H,
        W]`` (or ``[B, I, H, W]``) bool or 0/1, True where a pixel is image rather than
        padding; None: every pixel is.

        Returns ``[R, tokens_per_image, text_hidden_size]`` in the model's dtype, ``R`` the tiles
        that are not all zeros: the processor pads a batch whose prompts hold different numbers
        of images with all-zero tiles, and those are dropped, as transformers does (a real,
        normalised tile is never exactly zero everywhere). Equals transformers'
        ``Idefics3Model.get_image_features(...).pooler_output`` concatenated and reshaped.
        """
        pixel_values, pixel_attention_mask = _flatten_tiles(pixel_values, pixel_attention_mask)
        dtype = self.connector.modality_projection.proj.weight.dtype
        pixel_values = pixel_values.to(dtype)
        real = pixel_values.flatten(1).ne(0).any(dim=1)
        if not bool(real.all()):
            pixel_values = pixel_values[real]
            if pixel_attention_mask is not None:
                pixel_attention_mask = pixel_attention_mask[real]
        if pixel_values.shape[0] == 0:
            return pixel_values.new_zeros(0, self.tokens_per_image, self.config.text_hidden_size)
        patch_mask = (
            None
            if pixel_attention_mask is None
            else patch_mask_of(pixel_attention_mask, self.config.vision.patch_size)
        )
        features: torch.Tensor = self.connector(self.vision_model(pixel_values, patch_mask))
        return features

    def forward(
        self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`image_features`."""
        return self.image_features(pixel_values, pixel_attention_mask)

    def checkpoint_names(self) -> list[str]:
        """The checkpoint tensors this module needs (without the ``model.`` prefix)."""
        names = []
        for name, _ in self.named_parameters():
            path, _, kind = name.rpartition(".")
            if path.endswith(".qkv_proj"):
                stem = path.removesuffix("qkv_proj")
                names += [f"{stem}{proj}.{kind}" for proj in _QKV]
            else:
                names.append(name)
        return names

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy an Idefics3 checkpoint's vision and connector tensors into this module.

        Names are the checkpoint's (``model.vision_model.encoder.layers.0.self_attn.q_proj
        .weight``, the ``model.`` prefix optional); the text model's and ``lm_head`` are
        skipped. Raises ValueError naming a tensor that is unknown, misshapen or missing.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for full_name, tensor in weights:
            name = full_name.removeprefix(_BASE_PREFIX)
            if not name.startswith(_OWN_PREFIXES):
                continue
            path, _, kind = name.rpartition(".")
            stem, _, proj = path.rpartition(".")
            if proj in _QKV and stem.endswith(".self_attn"):
                target = params.get(f"{stem}.qkv_proj.{kind}")
                if target is None:
                    raise ValueError(
                        f"checkpoint tensor `{full_name}` does not belong to this model"
                    )
                rows = target.shape[0] // 3
                index = _QKV.index(proj)
                part = target.data[index * rows : (index + 1) * rows]
            elif name in params:
                part = params[name].data
            else:
                raise ValueError(f"checkpoint tensor `{full_name}` does not belong to this model")
            copy_checked(part, tensor.to(part.dtype), full_name)
            loaded.add(name)
        missing = [n for n in self.checkpoint_names() if n not in loaded]
        refuse_missing("vision", [_BASE_PREFIX + n for n in missing])


def _flatten_tiles(
    pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The processor's ``[B, I, C, H, W]`` (and ``[B, I, H, W]``) as ``B * I`` tiles; checks
    that ``pixel_values`` and the mask agree."""
    if pixel_values.dim() == 5:
        pixel_values = pixel_values.flatten(0, 1)
        if pixel_attention_mask is not None:
            pixel_attention_mask = pixel_attention_mask.flatten(0, 1)
    if pixel_values.dim() != 4:
        raise ValueError(
            f"pixel_values must be [N, C, H, W] or [B, I, C, H, W]; got {tuple(pixel_values.shape)}"
        )
    if pixel_attention_mask is not None:
        n, _, height, width = pixel_values.shape
        if tuple(pixel_attention_mask.shape) != (n, height, width):
            raise ValueError(
                f"pixel_attention_mask has shape {tuple(pixel_attention_mask.shape)}; "
                f"pixel_values {tuple(pixel_values.shape)} needs {(n, height, width)}"
            )
    return pixel_values, pixel_attention_mask


def load_idefics3_vision(
    directory: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> Idefics3Vision:
    """An `Idefics3Vision` from a Hugging Face Idefics3 / SmolVLM directory (config.json and
    safetensors), on ``device`` in ``dtype``, ready for `Idefics3Vision.image_features`.

    Raises ``UnsupportedModelError`` naming a config field it cannot run, ValueError naming a
    checkpoint tensor that is unknown, misshapen or missing.
    """
    config = Idefics3Config.from_hf_dict(
        json.loads((directory / "config.json").read_text(encoding="utf-8"))
    )
    with torch.device("meta"):
        model = Idefics3Vision(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.load_weights(encoder_tensors(directory, _OWN_PREFIXES, _BASE_PREFIX))
    model.eval()
    model.requires_grad_(False)
    return model
