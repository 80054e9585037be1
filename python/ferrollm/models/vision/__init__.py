"""Vision encoders for image-text models: the image side of Idefics3 / SmolVLM (a SigLIP
encoder and a pixel-shuffle connector), turning preprocessed image tiles into vectors that
replace the prompt's ``<image>`` placeholder embeddings."""

from ferrollm.models.vision.config import Idefics3Config, SiglipConfig
from ferrollm.models.vision.idefics3 import Idefics3Vision, load_idefics3_vision

__all__ = ["Idefics3Config", "Idefics3Vision", "SiglipConfig", "load_idefics3_vision"]
