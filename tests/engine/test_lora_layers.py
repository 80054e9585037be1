"""Many adapters in one batch equal transformers + peft, each row alone, and the base model.

A tiny Qwen2 (q/k/v biases) and a tiny tied Llama get three PEFT adapters each, of different
ranks and target sets (one rsLoRA, one with a per-module ``rank_pattern``); one prefill step
runs row 0 on the base model and rows 1..3 on the three adapters, in three slots. Each row's
last-position logits must equal the oracle's for its adapter within 1e-4 and the same row run
alone; the adapters must really move the logits (so a dropped delta fails). A quantized
(int8) base keeps the adapters in float on top: its top-1 equals the float base + adapter's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from lora_support import (
    PROMPTS,
    load_ours,
    ours_last_logits,
    peft_last_logits,
)

from ferrollm.lora.adapter import load_peft_adapter
from ferrollm.lora.layers import LoRAState, attach_lora, detach_lora
from ferrollm.models.llama import LlamaForCausalLM
from tiny_lora import make_adapter

MAX_LORAS = 3
MAX_RANK = 16
#: (r, lora_alpha, targets, extra LoraConfig fields) of the three adapters.
ADAPTERS = (
    (4, 8, ["q_proj", "v_proj"], {}),
    (
        8,
        16,
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        {"use_rslora": True},
    ),
    (
        16,
        8,
        ["o_proj", "down_proj", "up_proj"],
        {"rank_pattern": {"down_proj": 8}, "alpha_pattern": {"up_proj": 32}},
    ),
)


@pytest.fixture(scope="module", params=["qwen2", "tied"])
def setup(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[Path]]:
    from tiny_models import build_tiny_model

    family = str(request.param)
    base = build_tiny_model(family, tmp_path_factory.mktemp(f"lora-{family}"))
    adapters = [
        make_adapter(
            base,
            tmp_path_factory.mktemp(f"adapter{i}"),
            seed=10 + i,
            r=r,
            lora_alpha=alpha,
            target_modules=targets,
            **extra,
        )
        for i, (r, alpha, targets, extra) in enumerate(ADAPTERS)
    ]
    return base, adapters


def _attached(
    base: Path, adapters: list[Path], quantization: str | None = None
) -> tuple[LlamaForCausalLM, LoRAState]:
    model = load_ours(base, quantization)
    state = attach_lora(model, MAX_LORAS, MAX_RANK)
    for slot, path in enumerate(adapters):
        state.load_slot(slot, load_peft_adapter(f"a{slot}", path, model, MAX_RANK))
    return model, state


def test_mixed_batch_matches_peft_and_rows_alone(setup: tuple[Path, list[Path]]) -> None:
    base, adapters = setup
    model, state = _attached(base, adapters)
    slots = [-1, 0, 1, 2]
    prompts = [list(p) for p in PROMPTS]
    batch = ours_last_logits(model, state, prompts, slots)
    base_logits = peft_last_logits(base, None, prompts[0])
    for row, (slot, prompt) in enumerate(zip(slots, prompts, strict=True)):
        want = peft_last_logits(base, None if slot < 0 else adapters[slot], prompt)
        torch.testing.assert_close(batch[row], want, rtol=1e-4, atol=1e-4, msg=f"row {row}")
        alone = ours_last_logits(model, state, [prompt], [slot])
        # Float32 noise only: a 4-row and a 1-row GEMM sum in different orders (3.8e-5 on
        # logits up to 20 on an AMD EPYC's sgemm), while another row's delta leaking in would
        # move logits by the adapters' size (checked below to be far above this).
        scale = alone[0].abs().max().item()
        torch.testing.assert_close(
            batch[row], alone[0], rtol=1e-5, atol=1e-5 * scale, msg=f"row {row}"
        )
        if slot >= 0:  # the adapter really changes this row
            plain = peft_last_logits(base, None, prompt)
            assert (want - plain).abs().max() > 0.05, row
    torch.testing.assert_close(batch[0], base_logits, rtol=1e-4, atol=1e-4)


def test_cleared_and_reloaded_slots(setup: tuple[Path, list[Path]]) -> None:
    """A cleared slot is the base model; a slot refilled with another adapter is that one."""
    base, adapters = setup
    model, state = _attached(base, adapters)
    prompt = list(PROMPTS[0])
    state.clear_slot(1)
    torch.testing.assert_close(
        ours_last_logits(model, state, [prompt], [1])[0],
        peft_last_logits(base, None, prompt),
        rtol=1e-4,
        atol=1e-4,
    )
    state.load_slot(1, load_peft_adapter("again", adapters[2], model, MAX_RANK))
    torch.testing.assert_close(
        ours_last_logits(model, state, [prompt], [1])[0],
        peft_last_logits(base, adapters[2], prompt),
        rtol=1e-4,
        atol=1e-4,
    )
    detach_lora(state)
    torch.testing.assert_close(
        ours_last_logits(model, None, [prompt], [1])[0],
        peft_last_logits(base, None, prompt),
        rtol=1e-4,
        atol=1e-4,
    )


def test_quantized_base_keeps_adapters_in_float(setup: tuple[Path, list[Path]]) -> None:
    base, adapters = setup
    slots = [-1, 0, 1, 2]
    prompts = [list(p) for p in PROMPTS]
    dense, dense_state = _attached(base, adapters)
    want = ours_last_logits(dense, dense_state, prompts, slots)
    model, state = _attached(base, adapters, "int8")
    got = ours_last_logits(model, state, prompts, slots)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    # The tolerance test_tensor_parallel.py gives int8-rounded activations.
    assert (got - want).abs().max() <= 0.03 * want.abs().max()
    # ... and the adapters act on the quantized base as they do on the float one.
    plain = ours_last_logits(model, state, prompts, [-1] * 4)
    assert ((got - plain)[1:].abs().amax(-1) > 0.05).all()


def test_token_slots_are_checked_and_stable(setup: tuple[Path, list[Path]]) -> None:
    """Out-of-range slots are refused; the per-step tensors are refilled, not replaced (a
    compiled graph keeps seeing them), and rows past the step fall back to the base."""
    base, adapters = setup
    _, state = _attached(base, adapters)
    slots_tensor, mask = state.token_slots, state.mask
    with pytest.raises(ValueError, match="token slots"):
        state.set_token_slots(torch.tensor([0, MAX_LORAS]))
    state.set_token_slots(torch.tensor([2, 1, 0, 1, 2]))
    state.set_token_slots(torch.tensor([1, 0]))
    assert state.token_slots is slots_tensor and state.mask is mask
    assert state.token_slots[:6].tolist() == [1, 0, -1, -1, -1, -1]
    assert mask[2:6].abs().sum() == 0
    assert mask[0].tolist()[:3] == [0, 1, 0] and mask[1].tolist()[:3] == [1, 0, 0]
    # The step reads slots 0 and 1: the layers compute those two, not all MAX_LORAS.
    assert state.active and state.used == 2
    assert all(lora.used == 2 for lora in state.layers.values())
    state.set_token_slots(torch.tensor([-1, -1, -1]))
    assert not state.active and not any(lora.active for lora in state.layers.values())
    # A base-only step leaves the mask alone; the next step with adapters rewrites its rows
    # and clears the rows the earlier steps set beyond its own.
    state.set_token_slots(torch.tensor([2, 1, 0, 1, 2]))
    state.set_base_only()
    assert not state.active and state.sizes.tolist()[0] >= 1
    state.set_token_slots(torch.tensor([0]))
    assert mask[1:6].abs().sum() == 0 and mask[0].tolist()[:3] == [1, 0, 0]
    assert state.active and state.used == 1 and state.sizes.tolist() == [1, state.stride]


def test_attach_refuses_what_it_cannot_hold(tiny_model_factory: Callable[..., Path]) -> None:
    model = load_ours(tiny_model_factory("qwen2"))
    with pytest.raises(ValueError, match="max_loras"):
        attach_lora(model, 0, 8)
    state = attach_lora(model, 2, 8)
    with pytest.raises(ValueError, match="slot 2"):
        state.clear_slot(2)


def test_tensor_parallel_adapters_match_one_process(
    setup: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    """Two gloo ranks: q/k/v and gate/up keep their rows of B, o/down their columns of A with
    the partial delta summed by the all-reduce; rank 0's logits equal one process's."""
    from tp_support import run_group, run_single

    base, adapters = setup
    case = {
        "name": "lora",
        "path": str(base),
        "dtype": "float32",
        "adapters": [str(adapters[1]), str(adapters[2])],  # every projection; rank_pattern
        "max_lora_rank": MAX_RANK,
        "row_slots": [0, 1],
    }
    plain = run_single([{**case, "name": "plain", "adapters": []}])["plain"]
    single = run_single([case])["lora"]
    ranks = run_group([case], 2, tmp_path)
    assert "error" not in ranks[0]["lora"], ranks[0]["lora"]
    for want, got, base_logits in zip(
        single["logits"], ranks[0]["lora"]["logits"], plain["logits"], strict=True
    ):
        # The ranks' partial deltas are summed in another order than one process's.
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert (want - base_logits).abs().max() > 0.05
