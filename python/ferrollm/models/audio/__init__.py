"""Audio encoders for audio-text models: Qwen2-Audio's Whisper-style encoder and projector,
turning log-mel features into vectors that replace the prompt's ``<|AUDIO|>`` embeddings."""

from ferrollm.models.audio.config import Qwen2AudioConfig, WhisperEncoderConfig
from ferrollm.models.audio.qwen2_audio import Qwen2AudioTower, load_qwen2_audio_tower

__all__ = ["Qwen2AudioConfig", "Qwen2AudioTower", "WhisperEncoderConfig", "load_qwen2_audio_tower"]
