"""What a loaded media part is: decoded pixels, frames or samples with what a model's
processor needs to know about them. Pillow and numpy types only under TYPE_CHECKING for
Pillow, so this module imports without the media extra."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from PIL.Image import Image


@dataclass(frozen=True)
class ImageMedia:
    """A decoded image in RGB (transparency composited over white), its source format
    ("jpeg", "png", "webp", "gif") and its size in pixels."""

    image: Image
    format: str
    width: int
    height: int


@dataclass(frozen=True)
class VideoMedia:
    """Frames sampled uniformly from a video: ``frames`` is uint8 RGB of shape [F, H, W, 3],
    ``timestamps`` each frame's time in seconds (float64 [F]), ``indices`` each frame's index
    among the video's ``total_frames``, ``fps`` the stream's average frame rate (0.0 when the
    container does not say) and ``duration_s`` the stream's length."""

    frames: npt.NDArray[np.uint8]
    timestamps: npt.NDArray[np.float64]
    indices: npt.NDArray[np.int64]
    fps: float
    total_frames: int
    duration_s: float
    format: str


@dataclass(frozen=True)
class AudioMedia:
    """Decoded audio: mono float32 samples in [-1, 1] at ``sample_rate`` Hz, and the source
    format ("mp3", "wav", "flac")."""

    samples: npt.NDArray[np.float32]
    sample_rate: int
    format: str

    @property
    def duration_s(self) -> float:
        """Length in seconds."""
        return len(self.samples) / self.sample_rate


MediaItem: TypeAlias = ImageMedia | VideoMedia | AudioMedia
