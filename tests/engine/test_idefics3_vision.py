"""The image side of Idefics3 / SmolVLM equals transformers' on the same weights (float32).

A tiny seeded ``Idefics3ForConditionalGeneration`` (``tiny_models.build_tiny_idefics3``: 64-pixel
tiles of 8 x 8 patches, pixel shuffle 2) is loaded into `Idefics3Vision` from its safetensors and
into transformers; the oracle is ``Idefics3Model.get_image_features``, whose per-prompt
``pooler_output`` (every real tile's features, concatenated) must equal ours tile by tile.
Covered: one full tile, a batch, tiles padded as the processor pads smaller ones (a partial
``pixel_attention_mask``, not patch-aligned, so the bucketed positions and the key mask both
matter), the all-zero tiles that pad a batch being dropped, and refusals that name the
checkpoint tensor or config field at fault.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers  # the oracle; pinned in requirements/dev.txt, so never skipped
from safetensors.torch import load_file, save_file

from ferrollm.models.config import UnsupportedModelError
from ferrollm.models.vision import Idefics3Config, Idefics3Vision, load_idefics3_vision
from tiny_models import (
    IDEFICS3_IMAGE_TOKEN_ID,
    IDEFICS3_VISION_SIZES,
    TINY_SIZES,
)

#: Float32 against float32, same operations: only summation order may differ.
ATOL = 1e-5
SIDE = IDEFICS3_VISION_SIZES["image_size"]
TOKENS_PER_IMAGE = 16  # (64 / 8)² patches / 2²
TEXT_HIDDEN = TINY_SIZES["hidden_size"]


@pytest.fixture(scope="module")
def checkpoint(tiny_idefics3_dir: Path) -> Path:
    return tiny_idefics3_dir


@pytest.fixture(scope="module")
def ours(checkpoint: Path) -> Idefics3Vision:
    return load_idefics3_vision(checkpoint)


@pytest.fixture(scope="module")
def oracle(checkpoint: Path) -> transformers.Idefics3ForConditionalGeneration:
    model = transformers.Idefics3ForConditionalGeneration.from_pretrained(
        checkpoint, dtype=torch.float32
    )
    return model.eval()


def reference(
    oracle: transformers.Idefics3ForConditionalGeneration,
    pixel_values: torch.Tensor,
    pixel_attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """transformers' features for one prompt's tiles ``[1, I, 3, H, W]`` as ``[R, tokens, h]``."""
    with torch.no_grad():
        out = oracle.model.get_image_features(pixel_values, pixel_attention_mask)
    features = torch.cat(list(out.pooler_output))
    return features.reshape(-1, TOKENS_PER_IMAGE, TEXT_HIDDEN)


def tiles(count: int, seed: int) -> torch.Tensor:
    """``count`` random normalised tiles ``[count, 3, SIDE, SIDE]``."""
    return torch.randn(count, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(seed))


def padded(
    pixel_values: torch.Tensor, height: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A tile whose image is only ``height`` x ``width`` pixels, zero-padded at the bottom and
    right as the processor pads a smaller tile, and its pixel mask."""
    mask = torch.zeros(SIDE, SIDE, dtype=torch.bool)
    mask[:height, :width] = True
    return pixel_values * mask, mask


def test_config_facts(ours: Idefics3Vision) -> None:
    assert ours.tokens_per_image == TOKENS_PER_IMAGE
    assert ours.image_token_id == IDEFICS3_IMAGE_TOKEN_ID
    assert ours.config.text_hidden_size == TEXT_HIDDEN


def test_one_full_tile(ours: Idefics3Vision, oracle: transformers.PreTrainedModel) -> None:
    pixel_values = tiles(1, seed=1)
    got = ours.image_features(pixel_values)
    assert got.shape == (1, TOKENS_PER_IMAGE, TEXT_HIDDEN) and got.dtype == torch.float32
    torch.testing.assert_close(got, reference(oracle, pixel_values[None]), atol=ATOL, rtol=0)


def test_batch_of_two(ours: Idefics3Vision, oracle: transformers.PreTrainedModel) -> None:
    pixel_values = tiles(2, seed=2)
    got = ours.image_features(pixel_values, torch.ones(2, SIDE, SIDE, dtype=torch.bool))
    torch.testing.assert_close(got, reference(oracle, pixel_values[None]), atol=ATOL, rtol=0)
    # Batching changes nothing: each tile alone gives the same rows.
    for i in range(2):
        alone = ours.image_features(pixel_values[i : i + 1])
        torch.testing.assert_close(got[i : i + 1], alone, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("height", "width"),
    [
        (44, 36),  # 5.5 x 4.5 patches: partly-image patches count as real
        (32, 40),  # 4 rows of 8: fractions land exactly on bucket edges
        (64, 24),  # full height, a narrow strip
    ],
)
def test_padded_tile(
    ours: Idefics3Vision, oracle: transformers.PreTrainedModel, height: int, width: int
) -> None:
    full = tiles(2, seed=3)
    small, small_mask = padded(full[1], height, width)
    pixel_values = torch.stack([full[0], small])
    mask = torch.stack([torch.ones(SIDE, SIDE, dtype=torch.bool), small_mask])
    got = ours.image_features(pixel_values, mask)
    want = reference(oracle, pixel_values[None], mask[None])
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    # The mask matters: the padded tile read as a full one comes out otherwise.
    unmasked = ours.image_features(small[None])
    assert (unmasked - got[1:]).abs().max() > 1e-3


def test_all_zero_tiles_are_dropped(
    ours: Idefics3Vision, oracle: transformers.PreTrainedModel
) -> None:
    # Two prompts, one with two tiles, one with one tile and an all-zero padding tile, in the
    # processor's [B, I, 3, H, W] layout; the padding tile yields no features.
    real = tiles(3, seed=4)
    pixel_values = torch.stack([real[:2], torch.stack([real[2], torch.zeros_like(real[2])])])
    mask = torch.ones(2, 2, SIDE, SIDE, dtype=torch.bool)
    mask[1, 1] = False
    got = ours.image_features(pixel_values, mask)
    assert got.shape == (3, TOKENS_PER_IMAGE, TEXT_HIDDEN)
    want = torch.cat([reference(oracle, pixel_values[i : i + 1], mask[i : i + 1]) for i in (0, 1)])
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert ours.image_features(torch.zeros(1, 3, SIDE, SIDE)).shape == (0, 16, TEXT_HIDDEN)


def test_misshapen_tensor_is_refused_by_name(checkpoint: Path, tmp_path: Path) -> None:
    shutil.copy(checkpoint / "config.json", tmp_path / "config.json")
    tensors = load_file(checkpoint / "model.safetensors")
    name = "model.vision_model.encoder.layers.1.self_attn.k_proj.weight"
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        load_idefics3_vision(tmp_path)


def test_missing_tensor_is_refused_by_name(checkpoint: Path, tmp_path: Path) -> None:
    shutil.copy(checkpoint / "config.json", tmp_path / "config.json")
    tensors = load_file(checkpoint / "model.safetensors")
    del tensors["model.connector.modality_projection.proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.connector\.modality_projection\.proj\.weight"):
        load_idefics3_vision(tmp_path)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"vision_config": {"hidden_act": "relu"}}, "vision_config.hidden_act"),
        ({"vision_config": {"num_attention_heads": 5}}, "vision_config.hidden_size"),
        ({"vision_config": {"patch_size": 7}}, "vision_config.image_size"),
        ({"scale_factor": 3}, "scale_factor"),
        ({"text_config": {"hidden_size": None}}, "text_config.hidden_size"),
        ({"model_type": "llava"}, "model_type"),
    ],
)
def test_config_refusals_name_the_field(
    checkpoint: Path, change: dict[str, object], field: str
) -> None:
    raw = json.loads((checkpoint / "config.json").read_text())
    for key, value in change.items():
        if isinstance(value, dict):
            raw[key] = {k: v for k, v in {**raw[key], **value}.items() if v is not None}
        else:
            raw[key] = value
    with pytest.raises(UnsupportedModelError, match=f"`{field}`"):
        Idefics3Config.from_hf_dict(raw)


def test_a_smolvlm_shaped_config_takes_the_defaults_it_leaves_out() -> None:
    # SmolVLM-256M's shape: the vision config omits its layer count and activation (12 and
    # gelu_pytorch_tanh by default) and carries processor fields the encoder ignores.
    raw = {
        "model_type": "idefics3",
        "scale_factor": 4,
        "image_token_id": 49190,
        "text_config": {"model_type": "llama", "hidden_size": 576},
        "vision_config": {
            "model_type": "idefics3_vision",
            "hidden_size": 768,
            "image_size": 512,
            "intermediate_size": 3072,
            "num_attention_heads": 12,
            "patch_size": 16,
            "max_image_size": {"longest_edge": 512},
            "use_base_siglip": False,
        },
    }
    config = Idefics3Config.from_hf_dict(raw)
    assert config.vision.num_hidden_layers == 12
    assert config.vision.hidden_act == "gelu_pytorch_tanh"
    assert config.tokens_per_image == 64  # (512 / 16)² / 4²
    assert (config.connector_input_size, config.text_hidden_size) == (768 * 16, 576)


def test_bfloat16_stays_close_to_float32(checkpoint: Path, ours: Idefics3Vision) -> None:
    pixel_values, mask = padded(tiles(1, seed=5)[0], 44, 36)
    half = load_idefics3_vision(checkpoint, dtype=torch.bfloat16)
    got = half.image_features(pixel_values[None], mask[None])
    assert got.dtype == torch.bfloat16
    want = ours.image_features(pixel_values[None], mask[None])
    torch.testing.assert_close(got.float(), want, atol=0.1, rtol=0.05)
