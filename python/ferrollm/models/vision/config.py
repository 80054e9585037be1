"""The validated shape of an Idefics3 / SmolVLM ``config.json``, as far as the image side needs it.

An Idefics3 checkpoint is a SigLIP-style vision encoder, a connector (pixel shuffle, then one
projection into the text model's width) and a Llama text decoder. This module reads the first
two and the few text facts they depend on (``text_config.hidden_size``, ``image_token_id``).
Fields a config leaves out take transformers' defaults, since real checkpoints rely on them
(SmolVLM's ``vision_config`` omits ``num_hidden_layers`` and ``hidden_act``). Torch-free, so a
server can check a directory before it loads anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferrollm.models.config_fields import UnsupportedModelError, positive_float, positive_int

#: Vision activations the encoder can run (``hidden_act`` names, as transformers spells them).
VISION_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")
#: ``model_type`` values this reader accepts at the top level.
IDEFICS3_MODEL_TYPES = ("idefics3",)

# transformers' Idefics3VisionConfig / Idefics3Config defaults, for fields a config omits.
_VISION_DEFAULTS: Mapping[str, Any] = {
    "hidden_size": 1152,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 32,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
_DEFAULT_SCALE_FACTOR = 2
_DEFAULT_IMAGE_TOKEN_ID = 128257


def _positive_int(raw: Mapping[str, Any], key: str, where: str, default: Any = None) -> int:
    """`positive_int`, taking a square size given as (height, width) as its side."""
    value = raw.get(key, default)
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        return positive_int({key: value[0]}, key, where)
    return positive_int(raw, key, where, default)


@dataclass(frozen=True)
class SiglipConfig:
    """A SigLIP vision encoder: square images of ``image_size`` cut into ``patch_size`` patches,
    ``num_hidden_layers`` pre-LayerNorm layers of ``num_attention_heads`` heads."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_channels: int
    image_size: int
    patch_size: int
    hidden_act: str
    layer_norm_eps: float

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "vision_config.") -> SiglipConfig:
        """Raises ``UnsupportedModelError`` naming the field (``vision_config.hidden_act``)."""
        fields = {**_VISION_DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
        act = fields["hidden_act"]
        if act not in VISION_ACTIVATIONS:
            raise UnsupportedModelError(
                f"config.json: `{where}hidden_act` {act!r} is not supported; "
                f"supported: {', '.join(VISION_ACTIVATIONS)}"
            )
        config = cls(
            hidden_size=_positive_int(fields, "hidden_size", where),
            intermediate_size=_positive_int(fields, "intermediate_size", where),
            num_hidden_layers=_positive_int(fields, "num_hidden_layers", where),
            num_attention_heads=_positive_int(fields, "num_attention_heads", where),
            num_channels=_positive_int(fields, "num_channels", where),
            image_size=_positive_int(fields, "image_size", where),
            patch_size=_positive_int(fields, "patch_size", where),
            hidden_act=str(act),
            layer_norm_eps=positive_float(fields, "layer_norm_eps", where, 1e-6),
        )
        if config.hidden_size % config.num_attention_heads:
            raise UnsupportedModelError(
                f"config.json: `{where}hidden_size` ({config.hidden_size}) must be a multiple of "
                f"`{where}num_attention_heads` ({config.num_attention_heads})"
            )
        if config.image_size % config.patch_size:
            raise UnsupportedModelError(
                f"config.json: `{where}image_size` ({config.image_size}) must be a multiple of "
                f"`{where}patch_size` ({config.patch_size})"
            )
        return config

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    @property
    def patches_per_side(self) -> int:
        """Patches along each side of a full-size image (the position table is its square)."""
        return self.image_size // self.patch_size


@dataclass(frozen=True)
class Idefics3Config:
    """The image side of an Idefics3 checkpoint: its encoder, the connector's pixel-shuffle
    ``scale_factor``, the text model's width the connector projects into, and the id of the
    ``<image>`` placeholder token whose embeddings the image features replace."""

    vision: SiglipConfig
    scale_factor: int
    text_hidden_size: int
    image_token_id: int

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any]) -> Idefics3Config:
        """Read a Hugging Face Idefics3 ``config.json`` dict.

        Raises ``UnsupportedModelError`` naming the field that is missing, malformed or a shape
        this implementation cannot run (a pixel shuffle that does not divide the patch grid).
        """
        model_type = raw.get("model_type")
        if model_type not in IDEFICS3_MODEL_TYPES:
            raise UnsupportedModelError(
                f"config.json: `model_type` {model_type!r} is not an Idefics3 model; "
                f"expected one of {', '.join(IDEFICS3_MODEL_TYPES)}"
            )
        vision_raw = raw.get("vision_config") or {}
        text_raw = raw.get("text_config")
        if not isinstance(vision_raw, Mapping):
            raise UnsupportedModelError("config.json: `vision_config` must be an object")
        if not isinstance(text_raw, Mapping):
            raise UnsupportedModelError("config.json: `text_config` must be an object")
        vision = SiglipConfig.from_dict(vision_raw)
        scale = _positive_int(raw, "scale_factor", "", _DEFAULT_SCALE_FACTOR)
        if vision.patches_per_side % scale:
            raise UnsupportedModelError(
                f"config.json: `scale_factor` ({scale}) must divide the patch grid's side "
                f"(`vision_config.image_size` / `vision_config.patch_size` = "
                f"{vision.patches_per_side})"
            )
        image_token_id = raw.get("image_token_id", _DEFAULT_IMAGE_TOKEN_ID)
        if isinstance(image_token_id, bool) or not isinstance(image_token_id, int):
            raise UnsupportedModelError(
                f"config.json: `image_token_id` must be an integer; got {image_token_id!r}"
            )
        return cls(
            vision=vision,
            scale_factor=scale,
            text_hidden_size=_positive_int(text_raw, "hidden_size", "text_config."),
            image_token_id=image_token_id,
        )

    @property
    def tokens_per_image(self) -> int:
        """Feature vectors one image (tile) yields: its full patch grid over ``scale_factor``
        squared. transformers calls this ``image_seq_len``; the prompt holds as many
        ``<image>`` tokens per tile."""
        return self.vision.patches_per_side**2 // self.scale_factor**2

    @property
    def connector_input_size(self) -> int:
        """Width of a pixel-shuffled feature: ``scale_factor``² encoder outputs side by side."""
        return self.vision.hidden_size * self.scale_factor**2
