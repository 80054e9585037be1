"""Qwen2-VL video preprocessing equals transformers' ``Qwen2VLVideoProcessor`` bit for bit.

The oracle resizes with torchvision (a test-only dependency: the Makefile's ``TEST_ORACLES``
installs it, so this never skips); ours reproduces it with torch alone, and importing ferrollm
and preprocessing a video never imports torchvision. Each case saves the processor's settings
as ``video_preprocessor_config.json`` and reads them back both ways, so the config reading is
checked too. Frames are seeded noise: odd and even counts (odd ones are padded with the last
frame), sizes resized up to ``min_pixels``, down to ``max_pixels``, left alone and very wide.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ferrollm.models.vision.qwen2_vl_images import Qwen2VLImageSettings
from ferrollm.models.vision.qwen2_vl_video import frame_pixel_cap, preprocess_video

#: (frames, height, width): up to the minimum, down past the maximum, unchanged, very wide.
SHAPES = [(1, 30, 40), (3, 56, 84), (4, 300, 500), (5, 1000, 1400), (2, 336, 336), (2, 28, 900)]
#: Processor settings beside its defaults: tight pixel limits, bilinear, the per-frame cap.
SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "tight-limits": {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 16},
    "bilinear": {"resample": 2, "max_pixels": 28 * 28 * 64},
    "capped-per-frame": {"cap_pixels_per_frame": True, "max_video_tokens": 300},
    "rescale-only": {"do_normalize": False},
}


def frames(count: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (count, height, width, 3), dtype=np.uint8)


def processor_and_settings(tmp_path: Path, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """transformers' video processor with ``kwargs``, saved and read back by it and by us."""
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    Qwen2VLVideoProcessor(**kwargs).save_pretrained(tmp_path)
    _, ours = Qwen2VLImageSettings.from_directory(tmp_path)
    return Qwen2VLVideoProcessor.from_pretrained(tmp_path), ours


@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_video_patches_equal_transformers(
    tmp_path: Path, name: str, shape: tuple[int, int, int]
) -> None:
    video_processor, settings = processor_and_settings(tmp_path, SETTINGS[name])
    video = frames(*shape, seed=sum(shape))
    want = video_processor(videos=[video], return_tensors="np")
    got = preprocess_video(video, settings)
    assert [list(got.grid_thw)] == want["video_grid_thw"].tolist()
    assert got.pixel_values.dtype == want["pixel_values_videos"].dtype
    np.testing.assert_array_equal(got.pixel_values, want["pixel_values_videos"])


def test_the_defaults_are_the_processors(tmp_path: Path) -> None:
    """With no config file at all, ours are the video processor class's defaults."""
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    _, ours = Qwen2VLImageSettings.from_directory(tmp_path)
    theirs = Qwen2VLVideoProcessor()
    assert (ours.min_pixels, ours.max_pixels) == (
        theirs.size["shortest_edge"],
        theirs.size["longest_edge"],
    )
    assert (ours.patch_size, ours.temporal_patch_size, ours.merge_size) == (14, 2, 2)
    assert ours.resample == int(theirs.resample)
    assert not ours.do_sample_frames and not theirs.do_sample_frames
    assert not ours.cap_pixels_per_frame and not theirs.cap_pixels_per_frame


def test_the_per_frame_cap_binds_long_videos() -> None:
    settings = Qwen2VLImageSettings(cap_pixels_per_frame=True, max_video_tokens=2000)
    assert frame_pixel_cap(settings, 2) == settings.max_pixels
    assert frame_pixel_cap(settings, 64) == int(2000 * 28 * 28 * 0.9) * 2 // 64
    assert frame_pixel_cap(settings, 10_000) == int(settings.min_pixels * 1.05)


def test_video_settings_fall_back_to_the_image_config(tmp_path: Path) -> None:
    """As transformers: no video config -> ``preprocessor_config.json`` over the video
    defaults; ``processor_config.json``'s nested ``video_processor`` comes first."""
    import json

    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"max_pixels": 50_000}))
    image, video = Qwen2VLImageSettings.from_directory(tmp_path)
    assert (image.min_pixels, image.max_pixels) == (56 * 56, 50_000)
    assert (video.min_pixels, video.max_pixels) == (128 * 28 * 28, 50_000)
    nested = {"video_processor": {"size": {"shortest_edge": 3136, "longest_edge": 9999}}}
    (tmp_path / "processor_config.json").write_text(json.dumps(nested))
    _, video = Qwen2VLImageSettings.from_directory(tmp_path)
    assert (video.min_pixels, video.max_pixels) == (3136, 9999)


def test_a_resample_without_a_torch_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="`resample`"):
        preprocess_video(frames(2, 30, 40), Qwen2VLImageSettings(resample=1))


PROBE = textwrap.dedent(
    """
    import sys
    if sys.argv[1] == "blocked":
        sys.modules["torchvision"] = None  # `import torchvision` raises ImportError
    import numpy as np
    import ferrollm
    from ferrollm.multimodal.qwen2_vl import Qwen2VLProcessor
    from ferrollm.models.vision.qwen2_vl_images import Qwen2VLImageSettings
    from ferrollm.models.vision.qwen2_vl_video import preprocess_video

    video = np.zeros((3, 60, 90, 3), np.uint8)
    patches = preprocess_video(video, Qwen2VLImageSettings())
    assert sys.argv[1] == "blocked" or "torchvision" not in sys.modules, "torchvision imported"
    print(patches.grid_thw)
    """
)


@pytest.mark.parametrize("mode", ["blocked", "present"])
def test_preprocessing_never_imports_torchvision(mode: str) -> None:
    """In a fresh interpreter: with torchvision unimportable it still works, and with it
    importable nothing imports it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(2, 4, 6)"
