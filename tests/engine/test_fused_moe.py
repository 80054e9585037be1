"""The grouped expert dispatch equals a per-token loop; MoE checkpoints load in every naming.

`dispatch` must give what routing each token alone gives, call each expert once (on all of its
rows) and skip experts without rows. The parity models (``test_model_parity``) must really
exercise both regimes: decode steps with more experts than rows, prefills sending many rows
to one expert. Checkpoints as transformers 5 saves them (per-expert names, Mixtral's
``block_sparse_moe.experts.N.w1``) load into the same model as the fused 3-D ``state_dict()``,
and ``int8`` keeps every expert quantized.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_model_parity import PROMPTS, Family, run_ours

import ferrollm.models.moe as moe_module
from ferrollm.engine.build import load_model
from ferrollm.executor.loader import load_model_source
from ferrollm.layers.fused_moe import Expert, dispatch, expert_counts, select_experts
from tiny_models import build_tiny_tokenizer

HIDDEN = 16
NUM_EXPERTS = 8


def _experts() -> tuple[list[Callable[[torch.Tensor], torch.Tensor]], list[list[int]]]:
    """Random linear maps as experts, and the row counts each was called with."""
    calls: list[list[int]] = [[] for _ in range(NUM_EXPERTS)]
    weights = torch.randn(NUM_EXPERTS, HIDDEN, HIDDEN, generator=torch.Generator().manual_seed(0))

    def make(e: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def expert(x: torch.Tensor) -> torch.Tensor:
            calls[e].append(len(x))
            return torch.tanh(x @ weights[e])

        return expert

    return [make(e) for e in range(NUM_EXPERTS)], calls


def _per_token(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    experts: list[Callable[[torch.Tensor], torch.Tensor]],
) -> torch.Tensor:
    """The naive reference: every token, every chosen expert, one at a time."""
    out = torch.zeros_like(x)
    for t in range(len(x)):
        for j in range(ids.shape[1]):
            out[t] += weights[t, j] * experts[int(ids[t, j])](x[t : t + 1])[0]
    return out


@pytest.mark.parametrize(
    "ids",
    [
        torch.tensor([[0, 5]]),  # decode of one row: six experts have none
        torch.tensor([[3], [3], [3], [3], [3]]),  # every row to one expert
        torch.tensor([[1, 2], [2, 1], [7, 1], [2, 7]]),  # experts 0, 3-6 have no rows
        torch.randint(0, NUM_EXPERTS, (40, 1), generator=torch.Generator().manual_seed(1)),
        torch.stack(
            [
                torch.randperm(NUM_EXPERTS, generator=torch.Generator().manual_seed(s))[:3]
                for s in range(30)
            ]
        ),
    ],
)
def test_dispatch_equals_a_per_token_loop(ids: torch.Tensor) -> None:
    x = torch.randn(len(ids), HIDDEN, generator=torch.Generator().manual_seed(2))
    weights = torch.rand(ids.shape, generator=torch.Generator().manual_seed(3))
    experts, calls = _experts()
    got = dispatch(x, weights, ids, experts)
    counts = expert_counts(ids, NUM_EXPERTS)
    # Each expert with rows ran once, on all of them; the others never ran.
    assert calls == [[c] if c else [] for c in counts]
    torch.testing.assert_close(got, _per_token(x, weights, ids, experts), rtol=1e-5, atol=1e-5)


def test_select_experts_softmax_then_top_k() -> None:
    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0]])
    probs = logits.softmax(-1)[0]
    weights, ids = select_experts(logits, 2, renormalize=False)
    assert ids.tolist() == [[0, 2]]
    torch.testing.assert_close(weights[0], probs[[0, 2]])
    weights, _ = select_experts(logits, 2, renormalize=True)
    torch.testing.assert_close(weights[0], probs[[0, 2]] / probs[[0, 2]].sum())


def test_parity_runs_have_idle_experts_and_crowded_experts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    family = Family("mixtral")
    seen: list[tuple[int, list[int]]] = []

    def recording(
        x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, experts: list
    ) -> torch.Tensor:  # type: ignore[type-arg]
        seen.append((len(x), expert_counts(ids, len(experts))))
        return dispatch(x, w, ids, experts)

    monkeypatch.setattr(moe_module, "dispatch", recording)
    run_ours(family, {0: PROMPTS[:3]}, max_num_batched_tokens=64)
    # Decode of three rows: six assignments over eight experts, so some sit idle.
    assert any(rows <= 3 and counts.count(0) >= 2 for rows, counts in seen)
    # The prefill of 29 rows: 58 assignments, one expert gets many of them.
    assert any(rows > 16 and max(counts) >= 8 for rows, counts in seen)


@pytest.fixture(scope="module", params=["mixtral", "qwen2-moe"])
def saved(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Family, Path]:
    family = Family(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    family.hf.save_pretrained(directory)
    build_tiny_tokenizer(directory)
    return family, directory


def test_saved_checkpoint_names_load_like_the_state_dict(saved: tuple[Family, Path]) -> None:
    family, directory = saved
    names = list(load_model_source(directory).iter_weights(torch.float32))
    assert not any(
        name.endswith(("experts.gate_up_proj", "experts.down_proj")) for name, _ in names
    )
    model = load_model(load_model_source(directory), torch.device("cpu"), torch.float32)
    ours = family.model()
    for (name, got), (_, want) in zip(
        model.state_dict().items(), ours.state_dict().items(), strict=True
    ):
        assert torch.equal(got, want), name


def test_int8_keeps_every_expert_quantized(saved: tuple[Family, Path]) -> None:
    family, directory = saved
    model = load_model(load_model_source(directory), torch.device("cpu"), torch.float32, "int8")
    # The routed experts (a shared expert of 48 features is not whole 32-value blocks: dense).
    experts = [
        e
        for layer in model.model.layers
        if hasattr(layer.mlp, "experts")
        for e in layer.mlp.experts
    ]
    assert len(experts) >= 8
    for expert in experts:
        assert isinstance(expert, Expert)
        for linear in (expert.gate_up_proj, expert.down_proj):
            assert linear.quantized is not None and linear.weight is None
    ids = torch.tensor(PROMPTS[4])
    dense = family.model()
    want, got = (m.compute_logits(_hidden(m, ids)) for m in (dense, model))
    # Most rows, not all: int8 rounding may flip a near-tied routing choice of a token.
    rows_close = (got - want).abs().amax(-1) <= 0.05 * want.abs().amax(-1)
    assert rows_close.float().mean() >= 0.7, rows_close


def _hidden(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Every MoE layer's MLP run on the embeddings: no attention metadata needed."""
    h = model.model.embed_tokens(ids)  # type: ignore[union-attr, operator]
    for layer in model.model.layers:  # type: ignore[union-attr]
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return h
