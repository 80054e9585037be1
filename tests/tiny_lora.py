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


#: Three adapters of different ranks and targets over a tiny base (one rsLoRA), as the engine,
#: compiled-decode and GPU tests mix them.
THREE_ADAPTERS: dict[str, dict[str, Any]] = {
    "qv8": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
    "mlp4": {"r": 4, "lora_alpha": 8, "target_modules": ["gate_proj", "up_proj", "down_proj"]},
    "all16": {
        "r": 16,
        "lora_alpha": 32,
        "use_rslora": True,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"],
    },
}


def peft_greedy(
    base_dir: Path,
    adapter_dir: Path | None,
    prompt: list[int],
    max_tokens: int,
    device: str = "cpu",
) -> list[int]:
    """transformers (+ peft on ``adapter_dir``) greedy tokens after ``prompt`` in float32 on
    ``device``, with no end token (as ignore_eos), one token at a time."""
    import peft
    import transformers

    model: Any = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = peft.PeftModel.from_pretrained(model, adapter_dir)
    model = model.to(device).eval()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_tokens):
            ids.append(int(model(torch.tensor([ids], device=device)).logits[0, -1].argmax()))
    return ids[len(prompt) :]
