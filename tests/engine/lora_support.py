"""LoRA test helpers: PEFT adapters made on the fly, transformers + peft as the oracle, and our
model run over a paged cache with one adapter slot per prompt row.

``tiny_lora.make_adapter(base_dir, out_dir, seed, **lora_config)`` saves a PEFT adapter with
random A and B (``init_lora_weights=False``, so it really changes the output);
``peft_last_logits`` is the oracle's logits at each prompt's last position;
``ours_last_logits`` runs the same prompts as one prefill step of our model, row ``i`` on slot
``slots[i]`` (-1 = the base model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ferrollm.engine.build import load_model
from ferrollm.executor.kv_cache import KVCache
from ferrollm.executor.loader import load_model_source
from ferrollm.executor.runner import ModelRunner, SyntheticPlan
from ferrollm.lora.layers import LoRAState
from ferrollm.models.llama import LlamaForCausalLM

CPU = torch.device("cpu")
BLOCK_SIZE = 4
PROMPTS = ([5, 17, 42, 99, 3, 250, 8], [300, 11, 64, 7, 128], [9, 8, 7], [1, 2, 3, 4, 5, 6])


def peft_last_logits(base_dir: Path, adapter_dir: Path | None, prompt: list[int]) -> torch.Tensor:
    """transformers (+ peft when ``adapter_dir`` is given): logits at the prompt's last token."""
    import peft
    import transformers

    model: Any = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = peft.PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits
    return logits[0, -1].float()


def load_ours(path: Path, quantization: str | None = None) -> LlamaForCausalLM:
    """Our float32 model of ``path``."""
    return load_model(load_model_source(str(path)), CPU, torch.float32, quantization)


def ours_last_logits(
    model: LlamaForCausalLM,
    state: LoRAState | None,
    prompts: list[list[int]],
    slots: list[int],
) -> torch.Tensor:
    """``[rows, vocab]``: one prefill step of every prompt, row ``i``'s tokens on ``slots[i]``."""
    spec = model.kv_cache_spec(BLOCK_SIZE, torch.float32)
    width = -(-max(map(len, prompts)) // BLOCK_SIZE)
    tables = np.arange(1, 1 + width * len(prompts), dtype=np.int32).reshape(len(prompts), -1)
    runner = ModelRunner(model, KVCache(spec, 1 + tables.size, CPU), CPU, torch.float32)
    positions = [np.arange(len(p)) for p in prompts]
    cu = np.cumsum([0, *map(len, prompts)]).astype(np.int32)
    plan = SyntheticPlan(
        input_ids=np.concatenate([np.array(p) for p in prompts]).astype(np.int64),
        positions=np.concatenate(positions).astype(np.int64),
        slot_mapping=np.concatenate(
            [
                t[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
                for t, pos in zip(tables, positions, strict=True)
            ]
        ).astype(np.int64),
        cu_seqlens_q=cu,
        context_lens=np.array([len(p) for p in prompts], dtype=np.int32),
        block_tables=tables,
        logits_indices=(cu[1:] - 1).astype(np.int64),
        block_copies=np.zeros((0, 2), dtype=np.int32),
    )
    if state is not None:
        token_slots = np.repeat(np.array(slots, dtype=np.int64), [len(p) for p in prompts])
        state.set_token_slots(torch.from_numpy(token_slots))
    with torch.inference_mode():
        hidden = runner.hidden_states(plan)
        logits = model.compute_logits(hidden[torch.from_numpy(plan.logits_indices)])
    return logits.float().clone()
