"""Idefics3 / SmolVLM image preprocessing and prompt placeholders, as its processor does them.

An image becomes tiles the encoder can take, and the prompt's ``<image>`` becomes the tokens
those tiles' features will replace:

1. resize so the longest edge is ``size.longest_edge`` (aspect kept, the short edge even);
2. with splitting on, resize up to whole multiples of ``max_image_size.longest_edge`` and cut
   into a ``rows`` x ``cols`` grid of square tiles, then add the whole image squeezed into one
   tile (the "global" image); an image that is already one tile is not split; with splitting
   off, every image is squeezed into one tile;
3. rescale to [0, 1] and normalise per channel; pad every tile of the batch to the largest,
   with a pixel mask of the real area.

Resizing is Pillow's (Lanczos by default) on 8-bit RGB, as transformers' Pillow image processor
does, so the tiles are the same arrays, not just close. The placeholder text per image is
``<fake_token_around_image><row_r_col_c><image>*n`` per tile, a newline after each grid row,
then ``\\n<fake_token_around_image><global-img><image>*n<fake_token_around_image>``; an unsplit
image is the global part alone, without the leading newline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from PIL import Image

IMAGE_TOKEN = "<image>"
FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"
#: No resize may make an edge longer than this (transformers' bound, 4k).
MAX_EDGE = 4096
#: Pillow's Lanczos filter id (what Idefics3 checkpoints' ``resample`` says).
LANCZOS = 1


@dataclass(frozen=True)
class Idefics3ImageSettings:
    """What ``preprocessor_config.json`` (and ``image_seq_len`` of processor_config.json) say;
    defaults are transformers' for a field the file leaves out."""

    longest_edge: int = 4 * 364
    tile_size: int = 364
    do_resize: bool = True
    do_image_splitting: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    do_pad: bool = True
    do_convert_rgb: bool = True
    resample: int = LANCZOS
    #: ``<image>`` tokens per tile: the vision side's ``tokens_per_image``.
    image_seq_len: int = 169

    @classmethod
    def from_dicts(
        cls, image_processor: Mapping[str, Any], image_seq_len: int
    ) -> Idefics3ImageSettings:
        """From a ``preprocessor_config.json`` dict; raises ValueError naming a field whose
        value cannot be run (a size given other than as ``longest_edge``)."""

        def edge(key: str, default: int) -> int:
            value = image_processor.get(key)
            if value is None:
                return default
            if not isinstance(value, Mapping) or not isinstance(value.get("longest_edge"), int):
                raise ValueError(
                    f"preprocessor_config.json: `{key}` must be {{'longest_edge': int}}; "
                    f"got {value!r}"
                )
            return int(value["longest_edge"])

        def flag(key: str) -> bool:
            return bool(image_processor.get(key, getattr(cls, key)))

        def triple(key: str) -> tuple[float, ...]:
            value = image_processor.get(key, getattr(cls, key))
            values = value if isinstance(value, (list, tuple)) else [value] * 3
            return tuple(float(v) for v in values)

        return cls(
            longest_edge=edge("size", cls.longest_edge),
            tile_size=edge("max_image_size", cls.tile_size),
            do_resize=flag("do_resize"),
            do_image_splitting=flag("do_image_splitting"),
            do_rescale=flag("do_rescale"),
            rescale_factor=float(image_processor.get("rescale_factor", cls.rescale_factor)),
            do_normalize=flag("do_normalize"),
            image_mean=triple("image_mean"),
            image_std=triple("image_std"),
            do_pad=flag("do_pad"),
            do_convert_rgb=flag("do_convert_rgb"),
            resample=int(image_processor.get("resample", cls.resample)),
            image_seq_len=image_seq_len,
        )

    @classmethod
    def from_directory(cls, directory: Path, tokens_per_image: int) -> Idefics3ImageSettings:
        """From a checkpoint directory's ``preprocessor_config.json`` (or the ``image_processor``
        section of ``processor_config.json``, where newer transformers saves it); the
        ``image_seq_len`` saved with the processor, else ``tokens_per_image``."""
        processor = _read_json(directory / "processor_config.json")
        image_processor = _read_json(directory / "preprocessor_config.json") or dict(
            processor.get("image_processor") or {}
        )
        seq_len = processor.get("image_seq_len", tokens_per_image)
        return cls.from_dicts(image_processor, int(seq_len))


@dataclass(frozen=True)
class Idefics3Images:
    """One prompt's images as tiles: ``pixel_values [tiles, 3, H, W]`` float32, the pixel mask
    ``[tiles, H, W]`` bool, and each image's tile grid ``(rows, cols)`` ((0, 0): unsplit),
    in the order of the prompt's ``<image>`` markers. An image's tiles are its grid in
    row-major order, then its global tile."""

    pixel_values: torch.Tensor
    pixel_attention_mask: torch.Tensor
    grids: tuple[tuple[int, int], ...]

    def tiles_of(self, image: int) -> int:
        """Tiles image ``image`` took: ``rows * cols + 1``, or 1 unsplit."""
        rows, cols = self.grids[image]
        return rows * cols + 1


def preprocess_images(
    images: Sequence[Image.Image], settings: Idefics3ImageSettings
) -> Idefics3Images:
    """Pillow images -> `Idefics3Images` (the steps of this module's docstring)."""
    tiles: list[np.ndarray] = []
    grids = []
    for image in images:
        image_tiles, grid = _tiles(_as_rgb(image, settings.do_convert_rgb), settings)
        tiles += image_tiles
        grids.append(grid)
    if not tiles:
        raise ValueError("no images to preprocess")
    arrays = [
        _rescaled(tile[None] if tile.ndim == 2 else np.moveaxis(tile, -1, 0), settings)
        for tile in tiles
    ]
    height = max(a.shape[1] for a in arrays)
    width = max(a.shape[2] for a in arrays)
    if not settings.do_pad and any(a.shape[1:] != (height, width) for a in arrays):
        raise ValueError("tiles of different sizes need do_pad")
    pixel_values = np.zeros((len(arrays), arrays[0].shape[0], height, width), dtype=np.float32)
    mask = np.zeros((len(arrays), height, width), dtype=bool)
    for i, array in enumerate(arrays):
        pixel_values[i, :, : array.shape[1], : array.shape[2]] = array
        mask[i, : array.shape[1], : array.shape[2]] = True
    return Idefics3Images(torch.from_numpy(pixel_values), torch.from_numpy(mask), tuple(grids))


def image_placeholder(rows: int, cols: int, image_seq_len: int) -> str:
    """The text one image's ``<image>`` marker becomes, for a ``rows`` x ``cols`` grid."""
    image_tokens = IMAGE_TOKEN * image_seq_len
    global_part = f"{FAKE_IMAGE_TOKEN}{GLOBAL_IMAGE_TOKEN}{image_tokens}{FAKE_IMAGE_TOKEN}"
    if rows == 0 and cols == 0:
        return global_part
    grid = "".join(
        "".join(f"{FAKE_IMAGE_TOKEN}<row_{r + 1}_col_{c + 1}>{image_tokens}" for c in range(cols))
        + "\n"
        for r in range(rows)
    )
    return f"{grid}\n{global_part}"


def expand_image_markers(text: str, grids: Sequence[tuple[int, int]], image_seq_len: int) -> str:
    """``text`` with its i-th ``<image>`` replaced by image i's placeholder text.

    Raises ValueError when the markers and the images do not pair up.
    """
    parts = text.split(IMAGE_TOKEN)
    if len(parts) - 1 != len(grids):
        raise ValueError(
            f"the prompt has {len(parts) - 1} {IMAGE_TOKEN} markers for {len(grids)} images"
        )
    out = [parts[0]]
    for (rows, cols), part in zip(grids, parts[1:], strict=True):
        out += [image_placeholder(rows, cols, image_seq_len), part]
    return "".join(out)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _as_rgb(image: Image.Image, convert: bool) -> Image.Image:
    """RGB, any transparency composited onto white (what the processor feeds its model)."""
    from PIL import Image as PILImage

    if not convert:
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = PILImage.new("RGBA", rgba.size, (255, 255, 255, 255))
        return PILImage.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _longest_edge_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """(height, width) with the longest edge ``longest`` (up or down), the other scaled and
    rounded up to even, then both kept within `MAX_EDGE`; the float steps are the processor's
    own, so sizes agree to the pixel."""
    aspect = width / height
    if width >= height:
        width = longest
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height  # of the resized image: the bound rescales what step one made
    if width >= height and width > MAX_EDGE:
        width = MAX_EDGE
        height = int(width / aspect)
    elif height > width and height > MAX_EDGE:
        height = MAX_EDGE
        width = int(height * aspect)
    return max(height, 1), max(width, 1)


def _tile_multiple_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """(height, width) grown to whole tiles: the longest edge first, the other from the
    aspect ratio, each rounded up to a multiple of ``tile``."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def _resized(image: Image.Image, height: int, width: int, resample: int) -> Image.Image:
    return image.resize((width, height), resample=resample)


def _tiles(
    image: Image.Image, settings: Idefics3ImageSettings
) -> tuple[list[np.ndarray], tuple[int, int]]:
    """One image's tiles (HWC uint8, or whatever channels it has) and its grid."""
    tile = settings.tile_size
    if settings.do_resize:
        height, width = _longest_edge_size(image.height, image.width, settings.longest_edge)
        image = _resized(image, height, width, settings.resample)
    if not settings.do_image_splitting:
        return [np.asarray(_resized(image, tile, tile, settings.resample))], (0, 0)
    height, width = _tile_multiple_size(image.height, image.width, tile)
    image = _resized(image, height, width, settings.resample)
    if height <= tile and width <= tile:
        return [np.asarray(image)], (0, 0)
    rows, cols = (height - tile) // tile + 1, (width - tile) // tile + 1
    pixels = np.asarray(image)
    crops = [
        pixels[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile]
        for r in range(rows)
        for c in range(cols)
    ]
    return [*crops, np.asarray(_resized(image, tile, tile, settings.resample))], (rows, cols)


def _rescaled(pixels: np.ndarray, settings: Idefics3ImageSettings) -> np.ndarray:
    """CHW uint8 -> float32: times ``rescale_factor`` (in float64, then cast), then
    ``(x - mean) / std`` per channel in float32, the processor's order and precision."""
    out = pixels.astype(np.float64) * settings.rescale_factor if settings.do_rescale else pixels
    out = out.astype(np.float32)
    if settings.do_normalize:
        mean = np.asarray(settings.image_mean, dtype=np.float32)[:, None, None]
        std = np.asarray(settings.image_std, dtype=np.float32)[:, None, None]
        out = (out - mean) / std
    result: np.ndarray = out
    return result
