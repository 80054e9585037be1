"""The audio side of Qwen2-Audio: a Whisper-style encoder, the projector, and their weights.

`Qwen2AudioTower.audio_features` turns a batch of clips' log-mel features (always 30 s,
``[B, n_mels, 3000]``, the clip's real frames marked by ``feature_attention_mask``) into one
``[n_tokens, text hidden]`` tensor per clip, which replace, in order, the embeddings of the
clip's ``<|AUDIO|>`` placeholder tokens. A clip of ``F`` real frames keeps ``L = (F - 1) // 2
+ 1`` positions after the strided convolution and ``L // 2`` tokens after the pooling
(`audio_token_count`, what the processor expands ``<|AUDIO|>`` to).

transformers runs the encoder over all 1,500 positions with the padding positions masked as
keys. Nothing after the convolutions mixes positions except attention (feed-forward and norms
act per position, the pooling pairs positions ``2i, 2i + 1`` that are both below ``L`` for a
kept token), so this module runs the layers over the first ``L`` positions of the batch's
longest clip only: the kept tokens are the same, and a 5 s clip costs a sixth of the
attention. The convolutions still see every frame, since a real frame's neighbour may be
padding.

Weights come from the checkpoint as saved (``audio_tower.*``, ``multi_modal_projector.*``,
either optionally under ``model.``); the decoder's are left to its own loader.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ferrollm.layers.linear import copy_checked
from ferrollm.models.audio.config import Qwen2AudioConfig, WhisperEncoderConfig
from ferrollm.models.encoder_checkpoint import encoder_tensors, refuse_missing

#: Prefix transformers 5's in-memory layout puts before the towers (absent as saved).
_BASE_PREFIX = "model."
#: Checkpoint subtrees (after the optional `_BASE_PREFIX`) this module loads.
_OWN_PREFIXES = ("audio_tower.", "multi_modal_projector.")


def audio_token_count(num_frames: torch.Tensor) -> torch.Tensor:
    """Tokens a clip of ``num_frames`` real mel frames yields: the strided convolution keeps
    ``(F - 1) // 2 + 1`` positions and the pooling halves them, rounding down."""
    positions = (num_frames - 1) // 2 + 1
    return (positions - 2) // 2 + 1


class EncoderAttention(nn.Module):
    """Bidirectional multi-head self-attention (no bias on the key projection, as Whisper)."""

    def __init__(self, config: WhisperEncoderConfig) -> None:
        super().__init__()
        dim = config.d_model
        self.num_heads = config.encoder_attention_heads
        self.head_dim = dim // self.num_heads
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``x [B, T, D]``; ``key_mask [B, T]`` True for the positions that may be attended."""
        b, t, _ = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

        # The query is scaled before the product, as transformers does (same rounding).
        q = heads(self.q_proj(x) * self.scaling)
        out = F.scaled_dot_product_attention(
            q, heads(self.k_proj(x)), heads(self.v_proj(x)), key_mask[:, None, None, :], scale=1.0
        )
        result: torch.Tensor = self.out_proj(out.transpose(1, 2).reshape(b, t, -1))
        return result


class EncoderLayer(nn.Module):
    """Pre-LayerNorm attention and GELU feed-forward blocks, each around a residual."""

    def __init__(self, config: WhisperEncoderConfig) -> None:
        super().__init__()
        self.self_attn = EncoderAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.fc1 = nn.Linear(config.d_model, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``[B, T, D]`` -> ``[B, T, D]``."""
        x = x + self.self_attn(self.self_attn_layer_norm(x), key_mask)
        x = x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))
        if x.dtype == torch.float16:  # as transformers: keep half precision finite
            limit = torch.finfo(x.dtype).max - 1000
            x = x.clamp(-limit, limit)
        return x


class WhisperStyleEncoder(nn.Module):
    """Qwen2-Audio's encoder: two convolutions with GELU (the second of stride 2), learned
    positions, the layers, a stride-2 average pool and a final LayerNorm."""

    def __init__(self, config: WhisperEncoderConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.d_model
        self.conv1 = nn.Conv1d(config.num_mel_bins, dim, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(config.max_source_positions, dim)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.layer_norm = nn.LayerNorm(dim)

    def forward(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``features [B, n_mels, num_frames]``, ``positions [B]`` (each clip's real
        positions after the convolutions) -> ``[B, max(positions) // 2, D]``; rows past a
        clip's own ``positions // 2`` are padding."""
        x = F.gelu(self.conv1(features))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        x = x + self.embed_positions.weight
        kept = int(positions.max())
        x = x[:, :kept]
        key_mask = torch.arange(kept, device=x.device)[None, :] < positions[:, None]
        for layer in self.layers:
            x = layer(x, key_mask)
        pairs = kept // 2
        x = x[:, : 2 * pairs].reshape(x.shape[0], pairs, 2, x.shape[2]).mean(dim=2)
        out: torch.Tensor = self.layer_norm(x)
        return out


class MultiModalProjector(nn.Module):
    """One linear layer (with bias) from the encoder's width into the text model's."""

    def __init__(self, config: Qwen2AudioConfig) -> None:
        super().__init__()
        self.linear = nn.Linear(config.encoder.d_model, config.text_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., d_model]`` -> ``[..., text hidden]``."""
        out: torch.Tensor = self.linear(x)
        return out


class Qwen2AudioTower(nn.Module):
    """Encoder and projector of a Qwen2-Audio checkpoint; see `audio_features`."""

    def __init__(self, config: Qwen2AudioConfig) -> None:
        super().__init__()
        self.config = config
        self.audio_tower = WhisperStyleEncoder(config.encoder)
        self.multi_modal_projector = MultiModalProjector(config)

    @property
    def audio_token_id(self) -> int:
        """The ``<|AUDIO|>`` placeholder token the features replace."""
        return self.config.audio_token_id

    @torch.no_grad()
    def audio_features(
        self, input_features: torch.Tensor, feature_attention_mask: torch.Tensor
    ) -> list[torch.Tensor]:
        """Each clip's ``[audio_token_count, text hidden]`` features, in the model's dtype.

        ``input_features [B, n_mels, 3000]`` and ``feature_attention_mask [B, 3000]`` (1 on
        a clip's real frames) as the feature extractor gives them. Equals the rows of
        transformers' ``multi_modal_projector(audio_tower(...))`` it splices into the
        prompt (the first ``audio_token_count`` of each clip)."""
        encoder = self.config.encoder
        if input_features.dim() != 3 or tuple(input_features.shape[1:]) != (
            encoder.num_mel_bins,
            encoder.num_frames,
        ):
            raise ValueError(
                f"input_features must be [B, {encoder.num_mel_bins}, {encoder.num_frames}]; "
                f"got {tuple(input_features.shape)}"
            )
        if tuple(feature_attention_mask.shape) != (input_features.shape[0], encoder.num_frames):
            raise ValueError(
                f"feature_attention_mask has shape {tuple(feature_attention_mask.shape)}; "
                f"the features need {(input_features.shape[0], encoder.num_frames)}"
            )
        dtype = self.multi_modal_projector.linear.weight.dtype
        frames = feature_attention_mask.to(torch.long).sum(dim=-1)
        if bool((frames < 1).any()):
            raise ValueError("every clip needs at least one real mel frame")
        positions = (frames - 1) // 2 + 1
        hidden = self.audio_tower(input_features.to(dtype), positions.to(input_features.device))
        projected = self.multi_modal_projector(hidden)
        counts = audio_token_count(frames).tolist()
        return [projected[i, :n] for i, n in enumerate(counts)]

    def checkpoint_names(self) -> list[str]:
        """The checkpoint tensors this module needs (without any ``model.`` prefix)."""
        return [name for name, _ in self.named_parameters()]

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy a Qwen2-Audio checkpoint's audio tower and projector tensors into this
        module (the decoder's are skipped). ValueError naming a tensor that is unknown,
        misshapen or missing."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for full_name, tensor in weights:
            name = full_name.removeprefix(_BASE_PREFIX)
            if not name.startswith(_OWN_PREFIXES):
                continue
            target = params.get(name)
            if target is None:
                raise ValueError(f"checkpoint tensor `{full_name}` does not belong to this model")
            copy_checked(target.data, tensor.to(target.dtype), full_name)
            loaded.add(name)
        missing = [n for n in self.checkpoint_names() if n not in loaded]
        refuse_missing("audio", missing)


def new_qwen2_audio_tower(
    directory: Path, device: torch.device | str, dtype: torch.dtype
) -> Qwen2AudioTower:
    """An uninitialised tower of the shape ``directory``'s config.json describes."""
    config = Qwen2AudioConfig.from_hf_dict(
        json.loads((directory / "config.json").read_text(encoding="utf-8"))
    )
    with torch.device("meta"):
        model = Qwen2AudioTower(config)
    return model.to(dtype=dtype).to_empty(device=device)


def load_qwen2_audio_tower(
    directory: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> Qwen2AudioTower:
    """A `Qwen2AudioTower` from a Hugging Face Qwen2-Audio directory, on ``device`` in
    ``dtype``. ``UnsupportedModelError`` naming a config field it cannot run, ValueError
    naming a checkpoint tensor that is unknown, misshapen or missing."""
    model = new_qwen2_audio_tower(directory, device, dtype)
    model.load_weights(encoder_tensors(directory, _OWN_PREFIXES, _BASE_PREFIX))
    model.eval()
    model.requires_grad_(False)
    return model
