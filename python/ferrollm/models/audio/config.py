"""The validated shape of a Qwen2-Audio ``config.json``, as far as the audio side needs it.

A Qwen2-Audio checkpoint is a Whisper-style audio encoder (``audio_config``), one linear
projector into the text model's width, and a Qwen2 decoder (``text_config``). This module reads
the first two and the facts they take from the rest (``text_config.hidden_size``, the
``<|AUDIO|>`` token's id). Fields a config leaves out take transformers' defaults (those of
Qwen2-Audio-7B), as real checkpoints rely on them. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferrollm.models.config_fields import UnsupportedModelError, positive_int

#: Encoder activations this implementation runs (transformers' names).
AUDIO_ACTIVATIONS = ("gelu",)
#: ``model_type`` values this reader accepts at the top level.
QWEN2_AUDIO_MODEL_TYPES = ("qwen2_audio",)

# transformers' Qwen2AudioConfig defaults for its ``audio_config``.
_ENCODER_DEFAULTS: Mapping[str, Any] = {
    "num_mel_bins": 128,
    "encoder_layers": 32,
    "encoder_attention_heads": 20,
    "encoder_ffn_dim": 5120,
    "d_model": 1280,
    "activation_function": "gelu",
    "scale_embedding": False,
    "max_source_positions": 1500,
}
_DEFAULT_AUDIO_TOKEN_ID = 151646


@dataclass(frozen=True)
class WhisperEncoderConfig:
    """A Whisper-style encoder: ``num_mel_bins`` log-mel channels through two convolutions
    (the second halves the frames), ``max_source_positions`` learned positions,
    ``encoder_layers`` pre-LayerNorm layers of ``encoder_attention_heads`` heads."""

    num_mel_bins: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    d_model: int
    activation_function: str
    scale_embedding: bool
    max_source_positions: int

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], where: str = "audio_config."
    ) -> WhisperEncoderConfig:
        """Raises ``UnsupportedModelError`` naming the field (``audio_config.d_model``)."""
        fields = {**_ENCODER_DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
        act = fields["activation_function"]
        if act not in AUDIO_ACTIVATIONS:
            raise UnsupportedModelError(
                f"config.json: `{where}activation_function` {act!r} is not supported; "
                f"supported: {', '.join(AUDIO_ACTIVATIONS)}"
            )
        config = cls(
            num_mel_bins=positive_int(fields, "num_mel_bins", where),
            encoder_layers=positive_int(fields, "encoder_layers", where),
            encoder_attention_heads=positive_int(fields, "encoder_attention_heads", where),
            encoder_ffn_dim=positive_int(fields, "encoder_ffn_dim", where),
            d_model=positive_int(fields, "d_model", where),
            activation_function=str(act),
            scale_embedding=bool(fields["scale_embedding"]),
            max_source_positions=positive_int(fields, "max_source_positions", where),
        )
        if config.d_model % config.encoder_attention_heads:
            raise UnsupportedModelError(
                f"config.json: `{where}d_model` ({config.d_model}) must be a multiple of "
                f"`{where}encoder_attention_heads` ({config.encoder_attention_heads})"
            )
        return config

    @property
    def num_frames(self) -> int:
        """Mel frames the encoder takes per clip (the second convolution halves them into
        the ``max_source_positions`` positions): 3,000, Whisper's 30 s of 10 ms frames."""
        return 2 * self.max_source_positions


@dataclass(frozen=True)
class Qwen2AudioConfig:
    """The audio side of a Qwen2-Audio checkpoint: its encoder, the text model's width the
    projector maps into, and the id of the ``<|AUDIO|>`` token the features replace."""

    encoder: WhisperEncoderConfig
    text_hidden_size: int
    audio_token_id: int

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any]) -> Qwen2AudioConfig:
        """Read a Hugging Face Qwen2-Audio ``config.json`` dict; ``UnsupportedModelError``
        naming the field that is missing or malformed."""
        model_type = raw.get("model_type")
        if model_type not in QWEN2_AUDIO_MODEL_TYPES:
            raise UnsupportedModelError(
                f"config.json: `model_type` {model_type!r} is not a Qwen2-Audio model; "
                f"expected one of {', '.join(QWEN2_AUDIO_MODEL_TYPES)}"
            )
        audio_raw = raw.get("audio_config") or {}
        text_raw = raw.get("text_config")
        if not isinstance(audio_raw, Mapping):
            raise UnsupportedModelError("config.json: `audio_config` must be an object")
        if not isinstance(text_raw, Mapping):
            raise UnsupportedModelError("config.json: `text_config` must be an object")
        token = raw.get("audio_token_index", raw.get("audio_token_id", _DEFAULT_AUDIO_TOKEN_ID))
        if isinstance(token, bool) or not isinstance(token, int):
            raise UnsupportedModelError(
                f"config.json: `audio_token_index` must be an integer; got {token!r}"
            )
        return cls(
            encoder=WhisperEncoderConfig.from_dict(audio_raw),
            text_hidden_size=positive_int(text_raw, "hidden_size", "text_config."),
            audio_token_id=token,
        )
