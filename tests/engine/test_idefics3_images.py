"""Idefics3 / SmolVLM preprocessing equals transformers' processor: the same tiles, pixel for
pixel, and the same prompt tokens; and the whole image path (our tiles through our encoder)
equals transformers' processor feeding its own model.

The oracle is ``Idefics3Processor`` with transformers' Pillow image processor (pinned with
``backend="pil"``: with torchvision present ``AutoProcessor`` picks the torchvision one, whose
pixels differ, docs/multimodal.md), saved with the tiny checkpoint
(``tiny_models.build_tiny_idefics3``: longest edge 128, 64-pixel tiles, 16 tokens a tile).
Images are seeded noise of awkward sizes: smaller than a tile (resized up), wide and tall
(split into grids), odd edges (the even rounding), transparency and grey levels (converted to
RGB on white).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers  # the oracle; pinned in requirements/dev.txt, so never skipped
from PIL import Image
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

from ferrollm.models.vision import load_idefics3_vision
from ferrollm.models.vision.idefics3_images import (
    IMAGE_TOKEN,
    Idefics3ImageSettings,
    expand_image_markers,
    preprocess_images,
)
from tiny_models import IDEFICS3_IMAGE_TOKEN_ID

TOKENS_PER_TILE = 16


def noise(height: int, width: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """A seeded noise image of ``height`` x ``width`` in ``mode``."""
    rng = np.random.default_rng(seed)
    channels = 4 if mode in ("RGBA", "LA") else 3
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGBA" if channels == 4 else "RGB")
    if mode in ("RGB", "RGBA"):
        return image
    image = image.convert(mode)
    if mode == "P":  # a palette entry marked transparent: composited like an alpha channel
        image.info["transparency"] = 0
    return image


IMAGE_SETS = {
    "small": [noise(30, 50)],
    "wide-and-tall": [noise(90, 200, seed=1), noise(200, 90, seed=2)],
    "odd-edges": [noise(101, 100, seed=3), noise(7, 300, seed=4), noise(65, 64, seed=5)],
    "modes": [
        noise(64, 64, "RGBA", 6),
        noise(33, 77, "L", 7),
        noise(40, 90, "P", 8),
        noise(50, 20, "LA", 9),
    ],
}


@pytest.fixture(scope="module")
def processor(tiny_idefics3_dir: Path) -> Any:
    loaded = transformers.AutoProcessor.from_pretrained(tiny_idefics3_dir, backend="pil")
    assert isinstance(loaded.image_processor, Idefics3ImageProcessorPil)
    return loaded


@pytest.fixture(scope="module")
def settings(tiny_idefics3_dir: Path) -> Idefics3ImageSettings:
    return Idefics3ImageSettings.from_directory(tiny_idefics3_dir, TOKENS_PER_TILE)


def test_settings_read_from_the_checkpoint(settings: Idefics3ImageSettings) -> None:
    assert (settings.longest_edge, settings.tile_size) == (128, 64)
    assert settings.image_seq_len == TOKENS_PER_TILE


@pytest.mark.parametrize("name", list(IMAGE_SETS))
@pytest.mark.parametrize("splitting", [True, False])
def test_tiles_and_prompt_equal_the_processor(
    processor: Any, settings: Idefics3ImageSettings, name: str, splitting: bool
) -> None:
    images = IMAGE_SETS[name]
    text = "Describe " + " then ".join([IMAGE_TOKEN] * len(images)) + " briefly."
    want = processor(
        text=[text], images=[images], do_image_splitting=splitting, return_tensors="pt"
    )
    got = preprocess_images(images, dataclasses.replace(settings, do_image_splitting=splitting))
    assert torch.equal(got.pixel_values, want["pixel_values"][0])
    assert torch.equal(got.pixel_attention_mask, want["pixel_attention_mask"][0].bool())
    assert len(got.grids) == len(images)
    assert sum(got.tiles_of(i) for i in range(len(images))) == got.pixel_values.shape[0]
    prompt = expand_image_markers(text, got.grids, settings.image_seq_len)
    ids = processor.tokenizer(prompt)["input_ids"]
    assert ids == want["input_ids"][0].tolist()
    # One <image> token per feature vector the tiles will give.
    assert ids.count(IDEFICS3_IMAGE_TOKEN_ID) == got.pixel_values.shape[0] * TOKENS_PER_TILE


def test_unresized_images_equal_the_processor(
    processor: Any, settings: Idefics3ImageSettings
) -> None:
    # Without the longest-edge resize, the grid's short side comes from the aspect ratio
    # after the long side is rounded up to whole tiles (60 x 100: 2 x 2, not 1 x 2).
    images = [noise(60, 100, seed=12), noise(129, 200, seed=13)]
    want = processor.image_processor(
        [images], do_resize=False, return_tensors="pt", return_row_col_info=True
    )
    got = preprocess_images(images, dataclasses.replace(settings, do_resize=False))
    assert got.grids == tuple(zip(want["rows"][0], want["cols"][0], strict=True))
    assert got.grids[0] == (2, 2)
    assert torch.equal(got.pixel_values, want["pixel_values"][0])


def test_default_sizes_equal_the_processor() -> None:
    # transformers' defaults (1456-pixel longest edge, 364-pixel tiles): a 4 x 3 grid.
    image = noise(500, 300, seed=9)
    want = Idefics3ImageProcessorPil()([image], return_tensors="pt", return_row_col_info=True)
    got = preprocess_images([image], Idefics3ImageSettings())
    assert got.grids == ((want["rows"][0][0], want["cols"][0][0]),) == ((4, 3),)
    assert torch.equal(got.pixel_values, want["pixel_values"][0])


def test_image_features_through_both_pipelines(
    processor: Any, tiny_idefics3_dir: Path, settings: Idefics3ImageSettings
) -> None:
    images = [noise(90, 200, seed=10), noise(40, 40, seed=11)]
    text = f"{IMAGE_TOKEN} and {IMAGE_TOKEN}"
    inputs = processor(text=[text], images=[images], return_tensors="pt")
    oracle = transformers.Idefics3ForConditionalGeneration.from_pretrained(
        tiny_idefics3_dir, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        out = oracle.model.get_image_features(
            inputs["pixel_values"], inputs["pixel_attention_mask"]
        )
    want = torch.cat(list(out.pooler_output))
    tiles = preprocess_images(images, settings)
    vision = load_idefics3_vision(tiny_idefics3_dir)
    got = vision.image_features(tiles.pixel_values, tiles.pixel_attention_mask)
    # Flattened, one row per <image> token of the prompt, in order.
    torch.testing.assert_close(got.flatten(0, 1), want, atol=1e-5, rtol=0)
    assert want.shape[0] == int((inputs["input_ids"] == IDEFICS3_IMAGE_TOKEN_ID).sum())


def test_markers_must_pair_with_images() -> None:
    with pytest.raises(ValueError, match="2 <image> markers for 1 images"):
        expand_image_markers(f"{IMAGE_TOKEN}{IMAGE_TOKEN}", [(0, 0)], TOKENS_PER_TILE)


def test_unsupported_size_field_is_named() -> None:
    with pytest.raises(ValueError, match="`max_image_size`"):
        Idefics3ImageSettings.from_dicts({"max_image_size": {"height": 64, "width": 64}}, 16)
