"""Idefics3 / SmolVLM on the engine side: the prompt processor and the tile encoder.

`Idefics3Processor.process` turns each image into tiles (``preprocess_images``), expands the
prompt's ``<image>`` markers into the tiles' placeholder tokens (``expand_image_markers``) and
tokenizes the result with the engine's tokenizer, so the ids are those transformers'
processor gives. Each tile becomes one `MediaInput`: a tile's features fill one contiguous run
of ``<image>`` tokens, while an image's runs are separated by its ``<row_r_col_c>`` and
``<fake_token_around_image>`` tokens, so per-tile inputs keep every span contiguous. A tile's
digest is a hash of its pixels and mask alone: the same tile (in a repeated image, or in two
images) is encoded once, whatever prompt it comes in.

`Idefics3Encoder.encode` runs the vision tower over a batch of tiles.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ferrollm.media.items import ImageMedia, MediaItem
from ferrollm.models.vision.idefics3 import Idefics3Vision
from ferrollm.models.vision.idefics3_images import (
    IMAGE_TOKEN,
    Idefics3ImageSettings,
    expand_image_markers,
    preprocess_images,
)
from ferrollm.multimodal.inputs import MediaInput, MediaKind, ProcessedPrompt
from ferrollm.tokenizer import Tokenizer

_PIXELS = "pixel_values"
_MASK = "pixel_attention_mask"


def tile_digest(pixel_values: torch.Tensor, pixel_mask: torch.Tensor) -> str:
    """A name for one tile by content: its pixels' and mask's shapes and bytes."""
    digest = hashlib.sha256(f"{tuple(pixel_values.shape)}{tuple(pixel_mask.shape)}".encode())
    digest.update(np.ascontiguousarray(pixel_values.numpy()).tobytes())
    digest.update(np.ascontiguousarray(pixel_mask.numpy()).tobytes())
    return f"idefics3-tile:{digest.hexdigest()}"


class Idefics3Processor:
    """The `MultimodalProcessor` of an Idefics3 checkpoint (images only)."""

    def __init__(self, tokenizer: Tokenizer, settings: Idefics3ImageSettings, image_token_id: int):
        self.tokenizer = tokenizer
        self.settings = settings
        #: The ``<image>`` token, which the tiles' features replace.
        self.image_token_id = image_token_id

    @classmethod
    def from_directory(
        cls, directory: Path, tokenizer: Tokenizer, vision: Idefics3Vision
    ) -> Idefics3Processor:
        """The processor of the checkpoint in ``directory`` (its preprocessor settings)."""
        settings = Idefics3ImageSettings.from_directory(directory, vision.tokens_per_image)
        if settings.image_seq_len != vision.tokens_per_image:
            raise ValueError(
                f"processor_config.json: `image_seq_len` ({settings.image_seq_len}) must equal "
                f"the vision tower's tokens per tile ({vision.tokens_per_image})"
            )
        return cls(tokenizer, settings, vision.image_token_id)

    @property
    def modalities(self) -> frozenset[MediaKind]:
        """Images only."""
        return frozenset({"image"})

    def placeholder(self, kind: MediaKind) -> str:
        """``<image>``: what the checkpoint's chat template writes for an image part."""
        if kind != "image":
            raise ValueError(f"this model takes images only, not {kind}")
        return IMAGE_TOKEN

    def process(
        self, prompt: str, media: Sequence[MediaItem], *, add_special_tokens: bool = True
    ) -> ProcessedPrompt:
        """See `MultimodalProcessor.process`; ``add_special_tokens`` as for a text prompt
        (False for a rendered chat, whose template wrote its own BOS)."""
        images = []
        for i, item in enumerate(media):
            if not isinstance(item, ImageMedia):
                raise ValueError(f"`media[{i}]`: this model takes images only")
            images.append(item.image)
        markers = prompt.count(IMAGE_TOKEN)
        if markers != len(images):
            raise ValueError(
                f"`media[{min(markers, len(images))}]`: the prompt has {markers} "
                f"{IMAGE_TOKEN} placeholders for {len(images)} images"
            )
        tiles: list[tuple[torch.Tensor, torch.Tensor]] = []
        grids = []
        for image in images:  # one at a time: a tile's tensors never depend on other images
            processed = preprocess_images([image], self.settings)
            grids.append(processed.grids[0])
            tiles += zip(processed.pixel_values, processed.pixel_attention_mask, strict=True)
        text = expand_image_markers(prompt, grids, self.settings.image_seq_len)
        token_ids = self.tokenizer.encode(text, add_special_tokens)
        runs = _image_token_runs(token_ids, self.image_token_id)
        if len(runs) != len(tiles) or any(n != self.settings.image_seq_len for _, n in runs):
            raise ValueError(
                f"`prompt`: its {IMAGE_TOKEN} tokens do not form one run of "
                f"{self.settings.image_seq_len} per image tile (does the text hold stray "
                f"{IMAGE_TOKEN} or tile tokens?)"
            )
        inputs = tuple(
            MediaInput(
                "image",
                tile_digest(pixels, mask),
                {_PIXELS: pixels[None], _MASK: mask[None]},
                offset,
                length,
            )
            for (pixels, mask), (offset, length) in zip(tiles, runs, strict=True)
        )
        return ProcessedPrompt(text, token_ids, inputs)


def _image_token_runs(token_ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of ``image_token_id`` in ``token_ids``."""
    ids = np.asarray(token_ids, dtype=np.int64) == image_token_id
    edges = np.flatnonzero(np.diff(np.concatenate([[False], ids, [False]]).astype(np.int8)))
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


class Idefics3Encoder:
    """Image tiles -> their ``<image>`` token embeddings, through the vision tower."""

    def __init__(self, vision: Idefics3Vision, device: torch.device) -> None:
        self.vision = vision
        self.device = device

    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        """One ``[length, text hidden]`` tensor per item (tiles batched in one pass)."""
        pixels = torch.cat([item.tensors[_PIXELS] for item in items]).to(self.device)
        masks = torch.cat([item.tensors[_MASK] for item in items]).to(self.device)
        features = self.vision.image_features(pixels, masks)
        if features.shape[0] != len(items):
            raise ValueError(f"the encoder kept {features.shape[0]} of {len(items)} tiles")
        return list(features.unbind(0))
