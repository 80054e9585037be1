"""Whisper's log-mel features, as Qwen2-Audio's processor computes them, without transformers.

transformers is no runtime dependency of the server, so the features are computed here, step
for step the way ``WhisperFeatureExtractor`` does in torch (its default path), and a test holds
them to its output on the same samples:

1. the clip is cut or padded with ``padding_value`` to the ``chunk_length`` window (30 s, so
   480,000 samples at 16 kHz);
2. a centred, reflect-padded STFT with a periodic Hann window of ``n_fft`` (400) samples every
   ``hop_length`` (160); the last frame is dropped, leaving 3,000 frames of 10 ms;
3. the power spectrum through a Slaney-scale, Slaney-normalised triangular mel filter bank of
   ``feature_size`` filters from 0 to 8 kHz;
4. ``log10`` (floored at 1e-10), floored again at 8 below the clip's maximum, and mapped by
   ``(x + 4) / 4``.

The frame mask marks ``ceil(samples / hop_length)`` frames as the clip's own (the window's
padding frames are silence the encoder still sees, but the model keeps no token for them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

#: ``feature_extractor_type`` values whose features this module computes.
FEATURE_EXTRACTOR_TYPES = ("WhisperFeatureExtractor",)
#: The filter bank's top frequency: Whisper's, whatever the sample rate.
_MAX_MEL_HZ = 8000.0


@dataclass(frozen=True)
class LogMelSettings:
    """A Whisper feature extractor's settings (``preprocessor_config.json``)."""

    feature_size: int = 80
    sampling_rate: int = 16_000
    hop_length: int = 160
    chunk_length: int = 30
    n_fft: int = 400
    padding_value: float = 0.0

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LogMelSettings:
        """Settings from a feature extractor's config dict (transformers' defaults for the
        fields it leaves out). ValueError naming a field this module cannot honour."""
        kind = raw.get("feature_extractor_type", FEATURE_EXTRACTOR_TYPES[0])
        if kind not in FEATURE_EXTRACTOR_TYPES:
            raise ValueError(f"feature extractor {kind!r} is not supported")
        if raw.get("dither", 0.0):
            raise ValueError("a feature extractor with `dither` (random noise) is not supported")
        defaults = cls()
        values: dict[str, Any] = {}
        for name in ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft"):
            value = raw.get(name, getattr(defaults, name))
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"feature extractor `{name}` must be a positive integer")
            values[name] = value
        values["padding_value"] = float(raw.get("padding_value", defaults.padding_value))
        return cls(**values)

    @classmethod
    def from_directory(cls, directory: Path) -> LogMelSettings:
        """The settings of a checkpoint: ``preprocessor_config.json``, or the
        ``feature_extractor`` entry of ``processor_config.json`` (transformers 5 saves it
        there); transformers' defaults when neither exists."""
        preprocessor = directory / "preprocessor_config.json"
        if preprocessor.is_file():
            return cls.from_dict(json.loads(preprocessor.read_text(encoding="utf-8")))
        processor = directory / "processor_config.json"
        if processor.is_file():
            raw = json.loads(processor.read_text(encoding="utf-8")).get("feature_extractor")
            if isinstance(raw, Mapping):
                return cls.from_dict(raw)
        return cls()

    @property
    def num_samples(self) -> int:
        """Samples in the window every clip is cut or padded to."""
        return self.chunk_length * self.sampling_rate

    @property
    def num_frames(self) -> int:
        """Feature frames per clip (3,000 for Whisper's 30 s)."""
        return self.num_samples // self.hop_length


def _hz_to_slaney_mel(hz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Slaney's mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above."""
    mels = 3.0 * hz / 200.0
    above = hz >= 1000.0
    mels[above] = 15.0 + np.log(hz[above] / 1000.0) * (27.0 / np.log(6.4))
    return mels


def _slaney_mel_to_hz(mels: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The inverse of `_hz_to_slaney_mel`."""
    hz = 200.0 * mels / 3.0
    above = mels >= 15.0
    hz[above] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mels[above] - 15.0))
    return hz


def mel_filter_bank(settings: LogMelSettings) -> npt.NDArray[np.float32]:
    """``[n_fft // 2 + 1, feature_size]`` triangular filters, centred at points evenly
    spaced in Slaney mels from 0 to 8 kHz, each scaled to unit area (Slaney's norm: 2 over
    its width in Hz)."""
    bins = settings.n_fft // 2 + 1
    edges_mel = np.linspace(
        0.0,
        float(_hz_to_slaney_mel(np.array([_MAX_MEL_HZ]))[0]),
        settings.feature_size + 2,
    )
    edges = _slaney_mel_to_hz(edges_mel)
    fft_hz = np.linspace(0, settings.sampling_rate // 2, bins)
    offsets = edges[None, :] - fft_hz[:, None]  # [bins, filters + 2]
    widths = np.diff(edges)
    rising = -offsets[:, :-2] / widths[:-1]
    falling = offsets[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32)
    filters *= (2.0 / (edges[2:] - edges[:-2]))[None, :]
    return filters


class LogMel:
    """Computes one clip's features; holds the filter bank and window for its settings."""

    def __init__(self, settings: LogMelSettings) -> None:
        self.settings = settings
        self._filters = torch.from_numpy(mel_filter_bank(settings)).T.contiguous()
        self._window = torch.hann_window(settings.n_fft)

    def __call__(self, samples: npt.ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
        """``samples`` (mono, at ``settings.sampling_rate``) -> features ``[feature_size,
        num_frames]`` float32 and the frame mask ``[num_frames]`` int32 (1 on the clip's
        frames)."""
        s = self.settings
        clip = np.asarray(samples, dtype=np.float32).reshape(-1)[: s.num_samples]
        wave = torch.full((s.num_samples,), s.padding_value, dtype=torch.float32)
        wave[: len(clip)] = torch.from_numpy(np.ascontiguousarray(clip))
        spectrum = torch.stft(
            wave[None], s.n_fft, s.hop_length, window=self._window, return_complex=True
        )
        power = (spectrum[..., :-1].abs() ** 2).contiguous()
        log_spec = torch.clamp(self._filters @ power, min=1e-10).log10()[0]
        log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
        features = (log_spec + 4.0) / 4.0
        mask = torch.zeros(s.num_frames, dtype=torch.int32)
        mask[: math.ceil(len(clip) / s.hop_length)] = 1
        return features, mask
