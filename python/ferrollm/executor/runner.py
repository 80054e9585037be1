"""The model runner: a ``StepPlan`` in, the logits to sample out.

``run(plan)`` copies forked blocks, moves the plan's columns to the device, runs the model over
every scheduled token, and projects only the sampled positions (``plan.logits_indices``) to the
vocabulary. The result is CPU float32 and C-contiguous, so ``.numpy()`` is a zero-copy view the
Rust sampler reads directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from ferrollm.executor.kv_cache import KVCache, KVCacheSpec
from ferrollm.executor.prompt_logprobs import PromptTargets, score_prompt_tokens
from ferrollm.executor.step_extras import EmbeddingOverride, LogitRows, project_rows
from ferrollm.layers.attention import (
    AttentionBackend,
    AttentionContext,
    PagedBatch,
    TorchSDPABackend,
    backend_for,
)


class CausalLM(Protocol):
    """What the runner needs of a model (``LlamaForCausalLM`` has it)."""

    #: The window of every layer's attention (None: full), and the other windows some of its
    #: layers use instead (Gemma's sliding layers between full ones).
    sliding_window: int | None
    layer_windows: tuple[int, ...]
    #: The cap on its attention scores (Gemma 2), or None.
    attention_softcap: float | None

    @property
    def vocab_size(self) -> int: ...

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        embeds: EmbeddingOverride | None = None,
    ) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


class StepInputs(PagedBatch, Protocol):
    """The parts of a ``ferrollm.StepPlan`` the runner reads."""

    @property
    def input_ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def logits_indices(self) -> npt.NDArray[np.int64]: ...
    @property
    def block_copies(self) -> npt.NDArray[np.int32]: ...


class DecodeGraphs(Protocol):
    """Decode steps run another way (``compiled_decode.CompiledDecode`` on the CPU,
    ``ferrollm.platforms.cuda_graphs.CudaGraphDecode`` on CUDA)."""

    #: The most rows a step it takes can have.
    max_rows: int

    def accepts(self, plan: StepInputs) -> bool:
        """Whether ``run`` can take ``plan``."""
        ...

    def run(self, plan: StepInputs) -> torch.Tensor:
        """The logits of ``plan``'s samples (model dtype); under ``torch.inference_mode()``."""
        ...


class ModelRunner:
    """Runs one model over a paged KV cache, one scheduler step at a time."""

    def __init__(
        self,
        model: CausalLM,
        kv_cache: KVCache,
        device: torch.device,
        dtype: torch.dtype,
        backend: AttentionBackend | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = device
        self.dtype = dtype
        self.backend = backend_for(
            backend or TorchSDPABackend(),
            softcap=model.attention_softcap,
            values_are_keys=kv_cache.spec.values_are_keys,
        )
        #: Compiled graphs for decode steps (``set_compiled``); None = every step eager.
        self.compiled: DecodeGraphs | None = None

    def set_compiled(self, compiled: DecodeGraphs | None) -> None:
        """Run the decode steps ``compiled`` accepts through it (None: all eager)."""
        self.compiled = compiled

    def run(
        self,
        plan: StepInputs,
        prompt_targets: PromptTargets | None = None,
        *,
        embeds: EmbeddingOverride | None = None,
        keep_logits: LogitRows | None = None,
        positions: npt.NDArray[np.int64] | None = None,
    ) -> torch.Tensor:
        """Float32 logits ``[plan.num_samples, vocab]`` on the CPU, row ``i`` for sample ``i``.

        With ``prompt_targets`` (the prompt positions of this step whose requests asked for
        prompt logprobs) it also scores them from the same hidden states into
        ``prompt_targets.scores``; with ``keep_logits`` it puts the full logits of those rows
        in ``keep_logits.logits``. ``embeds`` replaces the input embedding of some tokens;
        ``positions`` (``[3, T]``: M-RoPE's temporal, height and width) replaces the plan's
        rotary positions (the KV slots stay the plan's); such a step runs eagerly.
        """
        with torch.inference_mode():
            self.kv_cache.copy_blocks(plan.block_copies)
            if len(plan.input_ids) == 0:
                return torch.empty((0, self.model.vocab_size), dtype=torch.float32)
            compiled = self.compiled
            if (
                compiled is not None
                and embeds is None
                and prompt_targets is None
                and keep_logits is None
                and positions is None
                and compiled.accepts(plan)
            ):
                return self._to_host(compiled.run(plan))
            hidden = self.hidden_states(plan, embeds, positions)
            if prompt_targets is not None:
                prompt_targets.scores = score_prompt_tokens(
                    hidden, self.model.compute_logits, self.model.vocab_size, prompt_targets
                )
            if keep_logits is not None:
                keep_logits.logits = project_rows(
                    hidden,
                    self.model.compute_logits,
                    self.model.vocab_size,
                    keep_logits.token_indices,
                )
            sampled = hidden.index_select(0, self._to_device(plan.logits_indices))
            logits = self.model.compute_logits(sampled)
            return self._to_host(logits)

    def _to_host(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` as CPU float32, C-contiguous.

        From an accelerator: converted to float32 there, then copied as is into page-locked
        memory (torch's caching host allocator hands a fresh block per step, so an earlier
        step's array is never overwritten). A blocking copy that also converts does the
        conversion on the host, after a copy into pageable memory: 59 ms a step for batch
        256 of a 128k vocabulary on an H100 (131 MB), where this takes a few.
        """
        source = logits.to(torch.float32).contiguous()
        if source.device.type == "cpu":
            return source
        host = torch.empty(source.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(source)
        return host

    def hidden_states(
        self,
        plan: StepInputs,
        embeds: EmbeddingOverride | None = None,
        positions: npt.NDArray[np.int64] | None = None,
    ) -> torch.Tensor:
        """The model's final hidden states ``[T, hidden]`` for every token of ``plan``
        (writing their K/V to the cache), rotated by ``positions`` when given, else the plan's;
        call under ``torch.inference_mode()``."""
        return self.model(
            self._to_device(plan.input_ids),
            self._to_device(plan.positions if positions is None else positions),
            self._context(plan),
            None if embeds is None else embeds.to(self.device),
        )

    def _context(self, plan: StepInputs) -> AttentionContext:
        def prepare(window: int | None) -> object:
            return self.backend.prepare(plan, self.kv_cache.block_size, self.device, window)

        windowed = {window: prepare(window) for window in self.model.layer_windows}
        metadata = prepare(self.model.sliding_window)
        return AttentionContext(self.backend, metadata, self.kv_cache.layers, windowed)

    def _to_device(self, array: npt.NDArray[np.int64]) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device, non_blocking=True)


@dataclass(frozen=True)
class SyntheticPlan:
    """A step built outside the scheduler (profiling, scoring): the columns ``ModelRunner.run``
    reads, as plain arrays."""

    input_ids: npt.NDArray[np.int64]
    positions: npt.NDArray[np.int64]
    slot_mapping: npt.NDArray[np.int64]
    cu_seqlens_q: npt.NDArray[np.int32]
    context_lens: npt.NDArray[np.int32]
    block_tables: npt.NDArray[np.int32]
    logits_indices: npt.NDArray[np.int64]
    block_copies: npt.NDArray[np.int32]


def profile_run(
    model: CausalLM,
    spec: KVCacheSpec,
    device: torch.device,
    num_tokens: int,
    num_samples: int = 1,
    backend: AttentionBackend | None = None,
) -> None:
    """One forward as large as a step can be, to measure peak activation memory.

    ``num_tokens`` tokens in one row (the worst case for attention's padded gather) and
    ``num_samples`` logit rows, over a 2-block cache: the block table repeats block 1, so the
    gathered context has the real size while the cache stays tiny (its contents are garbage,
    which is fine for a measurement). Size the real KV cache from the free memory after this.
    """
    positions = np.arange(num_tokens, dtype=np.int64)
    plan = SyntheticPlan(
        input_ids=np.zeros(num_tokens, dtype=np.int64),
        positions=positions,
        slot_mapping=spec.block_size + positions % spec.block_size,
        cu_seqlens_q=np.array([0, num_tokens], dtype=np.int32),
        context_lens=np.array([num_tokens], dtype=np.int32),
        block_tables=np.ones((1, -(-num_tokens // spec.block_size)), dtype=np.int32),
        logits_indices=np.full(num_samples, num_tokens - 1, dtype=np.int64),
        block_copies=np.zeros((0, 2), dtype=np.int32),
    )
    ModelRunner(model, KVCache(spec, 2, device), device, spec.dtype, backend).run(plan)


def teacher_forced_scores(
    model: CausalLM,
    token_ids: npt.NDArray[np.int64],
    spec: KVCacheSpec,
    device: torch.device,
    backend: AttentionBackend | None = None,
    chunk: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score a text token by token, as a language-model evaluation does.

    One prefill of ``token_ids [n]`` into a fresh cache; returns float32 ``logprobs [n - 1]``
    (of token ``i + 1`` given the tokens before it) and the model's greedy choice
    ``top1 [n - 1]`` at each position. Logits are made ``chunk`` rows at a time.
    """
    n = len(token_ids)
    positions = np.arange(n, dtype=np.int64)
    num_blocks = -(-n // spec.block_size)
    plan = SyntheticPlan(
        input_ids=token_ids.astype(np.int64),
        positions=positions,
        slot_mapping=spec.block_size + positions,
        cu_seqlens_q=np.array([0, n], dtype=np.int32),
        context_lens=np.array([n], dtype=np.int32),
        block_tables=np.arange(1, num_blocks + 1, dtype=np.int32)[None, :],
        logits_indices=positions,
        block_copies=np.zeros((0, 2), dtype=np.int32),
    )
    runner = ModelRunner(model, KVCache(spec, num_blocks + 1, device), device, spec.dtype, backend)
    targets = torch.from_numpy(token_ids[1:].astype(np.int64))
    logprobs, top1 = [], []
    with torch.inference_mode():
        hidden = runner.hidden_states(plan)
        for start in range(0, n - 1, chunk):
            rows = hidden[start : min(start + chunk, n - 1)]
            logits = model.compute_logits(rows).float().cpu().log_softmax(-1)
            want = targets[start : start + len(rows)]
            logprobs.append(logits.gather(1, want[:, None])[:, 0])
            top1.append(logits.argmax(-1))
    return torch.cat(logprobs), torch.cat(top1)
