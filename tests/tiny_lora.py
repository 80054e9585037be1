"""Tiny PEFT LoRA adapters made on the fly for the tiny models of `tiny_models` (shared by the
engine, server and end-to-end tests, like them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def make_adapter(base_dir: Path, out_dir: Path, seed: int, **config: Any) -> Path:
    """Save a PEFT LoRA adapter of the model in ``base_dir`` to ``out_dir``."""
    import peft
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    lora = peft.LoraConfig(init_lora_weights=False, **config)
    model = peft.get_peft_model(base, lora)
    with torch.no_grad():  # PEFT's random B is small: make the change plain in the logits
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(4.0)
    model.save_pretrained(out_dir)
    return out_dir
