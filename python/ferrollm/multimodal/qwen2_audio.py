"""Qwen2-Audio on the engine side: the prompt processor and the audio encoder.

`Qwen2AudioProcessor.process` turns each clip into Whisper log-mel features (30 s, padded,
with the mask of its real frames), expands the prompt's ``<|AUDIO|>`` markers into as many
``<|AUDIO|>`` tokens as the clip yields (`audio_token_count`) and tokenizes the result with the
engine's tokenizer, so the ids are those transformers' ``Qwen2AudioProcessor`` gives. Each
clip is one `MediaInput`, named by a hash of its features: the same clip is encoded once.

The features are computed by `ferrollm.models.audio.log_mel` (transformers is no runtime
dependency), equal to transformers' ``WhisperFeatureExtractor`` to a float32 rounding and as fast
(about 18 ms a clip at 128 channels on one CPU thread, whatever its length: the STFT runs over
the whole padded 30 s window); the intake runs the processor on a worker thread, and the
encoder cache keeps a clip's output.

`Qwen2AudioEncoder.encode` runs the audio tower over a batch of clips.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ferrollm.media.items import AudioMedia, MediaItem
from ferrollm.models.audio.log_mel import LogMel, LogMelSettings
from ferrollm.models.audio.qwen2_audio import Qwen2AudioTower, audio_token_count
from ferrollm.multimodal.inputs import MediaInput, MediaKind, ProcessedPrompt
from ferrollm.tokenizer import Tokenizer

#: The marker the processor expands, one per clip, and the token its features replace.
AUDIO_TOKEN = "<|AUDIO|>"
#: What one audio part stands as in a prompt: the marker between the clip's delimiters, as
#: Qwen2-Audio's chat template writes it.
AUDIO_PLACEHOLDER = "<|audio_bos|><|AUDIO|><|audio_eos|>"

_FEATURES = "input_features"
_MASK = "feature_attention_mask"


def clip_digest(features: torch.Tensor, mask: torch.Tensor) -> str:
    """A name for one clip by content: its features' and mask's shapes and bytes."""
    digest = hashlib.sha256(f"{tuple(features.shape)}{tuple(mask.shape)}".encode())
    digest.update(np.ascontiguousarray(features.numpy()).tobytes())
    digest.update(np.ascontiguousarray(mask.numpy()).tobytes())
    return f"qwen2-audio-clip:{digest.hexdigest()}"


class Qwen2AudioProcessor:
    """The `MultimodalProcessor` of a Qwen2-Audio checkpoint (audio only)."""

    def __init__(self, tokenizer: Tokenizer, settings: LogMelSettings, audio_token_id: int) -> None:
        self.tokenizer = tokenizer
        self.settings = settings
        self._log_mel = LogMel(settings)
        #: The ``<|AUDIO|>`` token, which the clips' features replace.
        self.audio_token_id = audio_token_id

    @classmethod
    def from_directory(
        cls, directory: Path, tokenizer: Tokenizer, tower: Qwen2AudioTower
    ) -> Qwen2AudioProcessor:
        """The processor of the checkpoint in ``directory`` (its feature extractor's
        settings); ValueError when their mel channels or window do not fit the audio tower."""
        settings = LogMelSettings.from_directory(directory)
        encoder = tower.config.encoder
        if settings.feature_size != encoder.num_mel_bins:
            raise ValueError(
                f"the feature extractor makes {settings.feature_size} mel channels; the audio "
                f"tower takes `audio_config.num_mel_bins` = {encoder.num_mel_bins}"
            )
        if settings.num_frames != encoder.num_frames:
            raise ValueError(
                f"the feature extractor pads to {settings.num_frames} frames; the audio "
                f"tower takes {encoder.num_frames} (2 x `audio_config.max_source_positions`)"
            )
        return cls(tokenizer, settings, tower.audio_token_id)

    @property
    def sample_rate(self) -> int:
        """The rate the features are computed at (16 kHz): audio is decoded to it."""
        return self.settings.sampling_rate

    @property
    def modalities(self) -> frozenset[MediaKind]:
        """Audio only."""
        return frozenset({"audio"})

    def placeholder(self, kind: MediaKind) -> str:
        """``<|audio_bos|><|AUDIO|><|audio_eos|>``: what the chat template writes for a clip."""
        if kind != "audio":
            raise ValueError(f"this model takes audio only, not {kind}")
        return AUDIO_PLACEHOLDER

    def features(self, clip: AudioMedia) -> tuple[torch.Tensor, torch.Tensor]:
        """A clip's log-mel features ``[n_mels, 3000]`` and real-frame mask ``[3000]``, as
        transformers' processor computes them (padded or cut to 30 s)."""
        if clip.sample_rate != self.sample_rate:
            raise ValueError(f"the clip is at {clip.sample_rate} Hz, not {self.sample_rate} Hz")
        return self._log_mel(clip.samples)

    def process(
        self, prompt: str, media: Sequence[MediaItem], *, add_special_tokens: bool = True
    ) -> ProcessedPrompt:
        """See `MultimodalProcessor.process`: each ``<|AUDIO|>`` of ``prompt`` (one per clip,
        in order) expanded to the clip's tokens."""
        clips = []
        for i, item in enumerate(media):
            if not isinstance(item, AudioMedia):
                raise ValueError(f"`media[{i}]`: this model takes audio only")
            if item.sample_rate != self.sample_rate:
                raise ValueError(
                    f"`media[{i}]`: the audio is at {item.sample_rate} Hz; the model's features "
                    f"need {self.sample_rate} Hz"
                )
            clips.append(item)
        pieces = prompt.split(AUDIO_TOKEN)
        if len(pieces) - 1 != len(clips):
            raise ValueError(
                f"`media[{min(len(pieces) - 1, len(clips))}]`: the prompt has "
                f"{len(pieces) - 1} {AUDIO_TOKEN} placeholders for {len(clips)} audio clips"
            )
        prepared = [self.features(clip) for clip in clips]
        counts = [int(audio_token_count(mask.sum())) for _, mask in prepared]
        for i, n in enumerate(counts):
            if n < 1:
                raise ValueError(f"`media[{i}]`: the clip is too short for one audio token (40 ms)")
        text = pieces[0] + "".join(
            AUDIO_TOKEN * n + piece for n, piece in zip(counts, pieces[1:], strict=True)
        )
        token_ids = self.tokenizer.encode(text, add_special_tokens)
        spans = _audio_spans(token_ids, self.audio_token_id, counts)
        inputs = tuple(
            MediaInput(
                "audio",
                clip_digest(features, mask),
                {_FEATURES: features[None], _MASK: mask[None]},
                offset,
                n,
            )
            for (features, mask), offset, n in zip(prepared, spans, counts, strict=True)
        )
        return ProcessedPrompt(text, token_ids, inputs)


def _audio_spans(token_ids: Sequence[int], audio_token_id: int, counts: Sequence[int]) -> list[int]:
    """The offset of each clip's run of ``counts[i]`` audio tokens, taken in order; ValueError
    when the prompt's audio tokens are not exactly those runs (stray ``<|AUDIO|>`` text)."""
    at = np.flatnonzero(np.asarray(token_ids, dtype=np.int64) == audio_token_id)
    offsets = []
    start = 0
    for n in counts:
        run = at[start : start + n]
        if len(run) != n or int(run[-1]) - int(run[0]) != n - 1:
            break
        offsets.append(int(run[0]))
        start += n
    if len(offsets) != len(counts) or start != len(at):
        raise ValueError(
            f"`prompt`: its {AUDIO_TOKEN} tokens do not form one run per clip of "
            f"{', '.join(map(str, counts))} tokens (does the text hold a stray {AUDIO_TOKEN}?)"
        )
    return offsets


class Qwen2AudioEncoder:
    """Clips' features -> their ``<|AUDIO|>`` token embeddings, through the audio tower."""

    def __init__(self, tower: Qwen2AudioTower, device: torch.device) -> None:
        self.tower = tower
        self.device = device

    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        """One ``[length, text hidden]`` tensor per item (clips batched in one pass)."""
        features = torch.cat([item.tensors[_FEATURES] for item in items]).to(self.device)
        masks = torch.cat([item.tensors[_MASK] for item in items]).to(self.device)
        return self.tower.audio_features(features, masks)
