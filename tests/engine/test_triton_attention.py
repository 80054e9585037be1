"""The CUDA platform's decode path: the Triton paged decode kernel and the CUDA-graph runner.

The kernel must compute what the gathered SDPA path computes (grouped-query heads, a head size
that is no power of two, windows, capped scores, contexts over several tiles, padded rows of one
token). The graph runner must give the eager engine's greedy tokens and logprobs, padding a
batch to its bucket. Without a GPU the kernel runs under Triton's interpreter (tests/conftest.py)
and the graphs are "captured" as plain reruns of the step, so everything but the capture itself
is checked here; on a GPU (``cuda`` marker, or ``--device cuda``) the same tests run for real.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from parity_support import count_compiled_steps

from ferrollm import LLM, SamplingParams
from ferrollm.executor.runner import SyntheticPlan
from ferrollm.layers.attention import TorchSDPABackend, backend_for
from ferrollm.platforms import cuda_graphs
from ferrollm.platforms.cpu import CpuPlatform
from ferrollm.platforms.cuda import CudaPlatform
from ferrollm.platforms.cuda_graphs import Captured, CudaGraphDecode
from ferrollm.platforms.triton_attention import TritonPagedBackend, paged_decode_attention

DEVICE = torch.device("cuda" if CudaPlatform.available() else "cpu")
#: dtypes the interpreter computes right (it mishandles bfloat16 arithmetic); all on a GPU.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """The gathered SDPA backend's answer for the same decode rows (in float32)."""
    rows, block_size = q.shape[0], k_cache.shape[1]
    positions = lens.cpu().numpy().astype(np.int64) - 1
    table = tables.cpu().numpy()
    slots = table[np.arange(rows), positions // block_size].astype(np.int64) * block_size
    slots += positions % block_size
    plan = SyntheticPlan(
        input_ids=np.zeros(rows, dtype=np.int64),
        positions=positions,
        slot_mapping=slots,
        cu_seqlens_q=np.arange(rows + 1, dtype=np.int32),
        context_lens=lens.cpu().numpy(),
        block_tables=table,
        logits_indices=np.arange(rows, dtype=np.int64),
        block_copies=np.zeros((0, 2), dtype=np.int32),
    )
    backend = TorchSDPABackend()
    metadata = backend.prepare(plan, block_size, q.device, window)
    k32, v32 = k_cache.float(), v_cache.float()
    index = torch.from_numpy(slots).to(q.device)
    heads, dim = k_cache.shape[2], k_cache.shape[3]
    k_new = k32.view(-1, heads, dim)[index]
    v_new = v32.view(-1, heads, dim)[index]
    return backend.forward(q.float(), k_new, v_new, (k32, v32), metadata, scale, softcap)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block_size", "window", "softcap"),
    [
        (4, 2, 64, 4, None, None),  # grouped-query, tiny blocks: many table lookups per tile
        (8, 8, 96, 16, 5, None),  # one query head per KV head, D not a power of two, window
        (12, 4, 128, 16, None, 30.0),  # Gemma 2's capped scores
        (2, 1, 32, 8, 70, 50.0),  # a window wider than most contexts, capped
        (4, 1, 256, 16, None, None),  # Gemma's 256-wide heads: half-size tiles
    ],
)
def test_kernel_equals_the_gathered_sdpa_path(
    dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    dim: int,
    block_size: int,
    window: int | None,
    softcap: float | None,
) -> None:
    gen = torch.Generator().manual_seed(heads * dim + block_size)
    num_blocks, width = 48, 12
    lens = torch.tensor([1, 7, 3 * block_size, 5 * block_size + 3, 70, 130], dtype=torch.int32)
    lens = lens.clamp(max=width * block_size)
    rows = len(lens)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)

    k_cache, v_cache = (
        randn(num_blocks, block_size, kv_heads, dim),
        randn(num_blocks, block_size, kv_heads, dim),
    )
    tables = torch.randint(1, num_blocks, (rows, width), generator=gen, dtype=torch.int32)
    tables, lens = tables.to(DEVICE), lens.to(DEVICE)
    q = randn(rows, heads, dim)
    out = torch.full_like(q, float("nan"))
    scale = dim**-0.5
    paged_decode_attention(
        q, k_cache, v_cache, tables, lens, scale, window=window, softcap=softcap, out=out
    )
    expected = reference(q, k_cache, v_cache, tables, lens, scale, window, softcap)
    assert not out.isnan().any(), "every output element is written"
    error = (out.float() - expected).norm() / expected.norm()
    assert error < TOLERANCE[dtype], f"relative error {error:.2e}"


def test_kernel_refuses_heads_that_do_not_split() -> None:
    q = torch.zeros(1, 3, 16, device=DEVICE)
    cache = torch.zeros(2, 4, 2, 16, device=DEVICE)
    one = torch.ones(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="3 query heads do not split over 2 KV heads"):
        paged_decode_attention(q, cache, cache, one.view(1, 1), one, 1.0)


NUM_NEW_TOKENS = 8
PROMPTS = ["Hello world", "The quick brown fox jumps over", "def f(x): return x * 2"]
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=2)
OPTIONS: dict[str, Any] = {"dtype": "float32", "max_num_seqs": 4, "kv_cache_memory": "4MiB"}


def rerun(forward: Callable[[], torch.Tensor], pool: Any) -> Captured:
    """What `cuda_graphs.capture` gives, without CUDA: a "replay" reruns the step eagerly and
    writes its logits into the same output tensor, as a graph's replay would."""
    output = forward()

    def replay() -> None:
        output.copy_(forward())

    return Captured(replay=replay, output=output)


#: On a GPU the step is captured both ways (compiled by inductor first, and eager); on the CPU
#: only eager (the interpreted Triton kernel cannot go through inductor). The fused way has not
#: passed on a GPU yet (``cuda_graphs``' docstring).
FUSE = ["1", "0"] if DEVICE.type == "cuda" else ["0"]


@pytest.fixture(params=FUSE, ids=lambda fuse: f"fuse={fuse}")
def graph_engine(
    request: pytest.FixtureRequest,
    tiny_model_factory: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> LLM:
    """The tiny model served the CUDA platform's way: Triton decode attention, decode steps
    through `CudaGraphDecode` (on the CPU: the kernel interpreted, capture replaced by reruns)."""
    monkeypatch.setenv("FERROLLM_CUDA_GRAPH_FUSE", request.param)
    if DEVICE.type != "cuda":
        fake_cuda_graphs(monkeypatch)
    llm = LLM(tiny_model_factory("tied"), device=DEVICE.type, compile="on", **OPTIONS)
    graphs = llm.engine.runner.compiled
    assert isinstance(graphs, CudaGraphDecode) and graphs.buckets == (1, 2, 4)
    assert (graphs._compiled is not None) == (request.param == "1")
    return llm


def fake_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU platform with the CUDA platform's decode path, graphs "captured" as reruns."""
    monkeypatch.setattr(CpuPlatform, "attention_backend", lambda self: TritonPagedBackend())
    monkeypatch.setattr(CpuPlatform, "decode_graphs", CudaPlatform.decode_graphs)
    monkeypatch.setattr(cuda_graphs, "capture", rerun)
    monkeypatch.setattr(cuda_graphs.torch.cuda, "graph_pool_handle", lambda: None)


def test_graph_decode_equals_eager_decode(
    graph_engine: LLM, tiny_model_factory: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = count_compiled_steps(graph_engine, monkeypatch)
    batch = graph_engine.generate(PROMPTS, GREEDY)
    assert 3 in rows, "three rows decode together, padded to the bucket of 4"
    # The same device's eager steps (on the CPU here, under the fixture's patch, the kernel
    # interpreted; the kernel itself is held to the gathered SDPA path above).
    eager = LLM(tiny_model_factory("tied"), device=str(DEVICE), compile="off", **OPTIONS)
    assert eager.engine.runner.compiled is None
    assert isinstance(eager.engine.runner.backend, TritonPagedBackend)
    for prompt, ours in zip(PROMPTS, batch, strict=True):
        (theirs,) = eager.generate(prompt, GREEDY)
        assert ours.outputs[0].token_ids == theirs.outputs[0].token_ids, prompt
        ours_lp, theirs_lp = ours.outputs[0].logprobs, theirs.outputs[0].logprobs
        assert ours_lp is not None and theirs_lp is not None
        torch.testing.assert_close(
            torch.tensor([lp.logprob for lp in ours_lp]),
            torch.tensor([lp.logprob for lp in theirs_lp]),
            atol=1e-4,
            rtol=0,
        )


def test_compile_on_refuses_a_backend_without_the_kernel(
    tiny_model_factory: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CpuPlatform, "decode_graphs", CudaPlatform.decode_graphs)
    monkeypatch.setattr(CpuPlatform, "attention_backend", lambda self: TorchSDPABackend())
    with pytest.raises(ValueError, match="CUDA graphs need the Triton paged attention"):
        LLM(tiny_model_factory("tied"), device="cpu", compile="on", **OPTIONS)


def test_capped_scores_keep_the_kernel_but_a_latent_cache_does_not() -> None:
    triton_backend = TritonPagedBackend()
    assert backend_for(triton_backend, softcap=30.0) is triton_backend
    fallback = backend_for(triton_backend, values_are_keys=True)
    assert type(fallback) is TorchSDPABackend


def test_a_failed_fused_step_falls_back_to_capturing_the_eager_one(
    tiny_model_factory: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if DEVICE.type != "cuda":
        fake_cuda_graphs(monkeypatch)
    monkeypatch.setenv("FERROLLM_CUDA_GRAPH_FUSE", "1")

    def broken_compile(fn: Any, **options: Any) -> Callable[..., torch.Tensor]:
        def compiled(*args: Any) -> torch.Tensor:
            raise RuntimeError("inductor says no")

        return compiled

    monkeypatch.setattr(cuda_graphs.torch, "compile", broken_compile)
    llm = LLM(tiny_model_factory("tied"), device=DEVICE.type, compile="on", **OPTIONS)
    graphs = llm.engine.runner.compiled
    assert isinstance(graphs, CudaGraphDecode) and graphs._compiled is None
    assert "the fused decode step failed; capturing the eager one" in caplog.text
    (output,) = llm.generate(PROMPTS[:1], GREEDY)
    assert len(output.outputs[0].token_ids) == NUM_NEW_TOKENS


def test_the_fuse_switch_takes_only_0_or_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERROLLM_CUDA_GRAPH_FUSE", "yes")
    with pytest.raises(ValueError, match="FERROLLM_CUDA_GRAPH_FUSE must be 0 or 1; got 'yes'"):
        cuda_graphs.fuse_by_default()
