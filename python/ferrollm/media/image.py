"""Decoding an image part with Pillow, refusing what would cost more than it is worth.

The size in the header is checked before any pixel is decoded: a longest side over
``MediaLimits.max_image_side`` (16,384 px; a 50,000 x 1 PNG is a few hundred bytes and no
photo) or more pixels than ``max_image_pixels`` is ``media_too_large``, as is anything Pillow's
own decompression-bomb guard refuses. Pillow's globals (``MAX_IMAGE_PIXELS``,
``LOAD_TRUNCATED_IMAGES``) are left as they are, so a truncated or corrupt file fails to load
and is ``invalid_media``. Pillow is told the one format the bytes were sniffed as, so none of
its other plugins parse client data.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from ferrollm.media._deps import missing
from ferrollm.media.errors import INVALID_MEDIA, MEDIA_TOO_LARGE, MediaError
from ferrollm.media.items import ImageMedia
from ferrollm.media.options import MediaLimits

if TYPE_CHECKING:
    from PIL import Image

#: Sniffed format -> Pillow's format name.
_PILLOW_FORMATS = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "gif": "GIF"}
#: White, what transparent pixels become.
_BACKGROUND = (255, 255, 255)


def decode_image(data: bytes, fmt: str, part_path: str, limits: MediaLimits) -> ImageMedia:
    """``data`` (sniffed as ``fmt``) decoded to RGB. Raises MediaError naming ``part_path``."""
    try:
        from PIL import Image
    except ImportError as error:
        raise missing("Pillow") from error
    if not data:
        raise MediaError(part_path, INVALID_MEDIA, "the image is empty (0 bytes)")
    try:
        with Image.open(io.BytesIO(data), formats=[_PILLOW_FORMATS[fmt]]) as image:
            width, height = image.size
            _check_size(width, height, part_path, limits)
            image.load()
            rgb = _to_rgb(image)
    except Image.DecompressionBombError as error:
        raise MediaError(
            part_path, MEDIA_TOO_LARGE, f"the image has too many pixels to decode: {error}"
        ) from error
    except MediaError:
        raise
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombWarning) as error:
        # Pillow reports a truncated file as OSError, a bad chunk or header as SyntaxError.
        raise MediaError(
            part_path, INVALID_MEDIA, f"the {fmt} image cannot be decoded: {error}"
        ) from error
    return ImageMedia(image=rgb, format=fmt, width=width, height=height)


def _check_size(width: int, height: int, part_path: str, limits: MediaLimits) -> None:
    if width <= 0 or height <= 0:
        raise MediaError(part_path, INVALID_MEDIA, f"the image is {width}x{height} pixels")
    if max(width, height) > limits.max_image_side:
        raise MediaError(
            part_path,
            MEDIA_TOO_LARGE,
            f"the image is {width}x{height} pixels; its longest side may be at most "
            f"{limits.max_image_side}",
        )
    if width * height > limits.max_image_pixels:
        raise MediaError(
            part_path,
            MEDIA_TOO_LARGE,
            f"the image is {width}x{height} = {width * height} pixels; at most "
            f"{limits.max_image_pixels} are decoded",
        )


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB, with any transparency composited over white rather than dropped (dropping it
    turns transparent regions into whatever colour they hide, often black)."""
    from PIL import Image

    if image.mode == "RGB":
        return image.copy()
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, _BACKGROUND)
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")
