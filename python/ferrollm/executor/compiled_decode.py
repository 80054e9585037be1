"""The decode step compiled with inductor: a few graphs serve every batch size.

A decode-only step (every row one new token, no embedding override, no prompt logprobs, no
kept logits) runs the whole model (embedding, every layer, final norm and LM head) as one
inductor graph instead of ~250 eager ops per layer stack, so no per-layer Python runs and torch's
OpenMP team enters far fewer parallel regions per token. Attention stays the opaque
``ferrollm::paged_attention`` custom op, and the block matmuls ``ferrollm::ggml_matmul``.

Shapes: rows are padded up to a bucket (``BUCKETS``): padded rows decode token 0 at position 0
into the scheduler's null block (block 0, never allocated, its contents never read), and their
logits are dropped. Block tables are padded to the widest a sequence can have. The row count
and the KV cache's block count stay symbolic in the graphs, every other size is static, so the
graphs split only where the model's Python does: one row, up to ``QUANTIZED_MAX_ROWS`` rows
(the block kernels) and more (the dense copies, where kept): up to three graphs for the default
model, whatever the buckets and the cache size.

Compiled graphs are cached on disk by inductor (its FX-graph and AOT caches) under
``compile_cache_dir()``, so a later start-up only retraces and loads the kernels. They are all
built at start-up (``warm_up``), not lazily, so no request waits for a compile. Default model,
2-core EPYC: start-up compiles ~75 s the first time, ~15 s from the cache. Steps of more than
``MAX_COMPILED_ROWS`` rows (``QUANTIZED_MAX_ROWS`` on a model whose many-row steps run on
oneDNN-packed copies: see `_has_packed_copies`), steps whose attention mode differs from the
graphs' (``PagedKernelBackend.parallel_for_decode``: long contexts, when the kernels run on
rayon's pool rather than torch's OpenMP team), and every prefill or mixed step run eagerly.

Measured on the default model (SmolLM2-135M Q4_1, bf16; ``benches/throughput.py
--max-tokens 64 --compile both --repeats 3``), offline tok/s eager -> compiled: batch 1
76.5 -> 95.3 (1.25x), batch 8 208.1 -> 235.4 (1.13x), batch 32 492.5 -> 533.9 (1.08x). In
float32 on the interleaved block kernels (``--repeats 2``, 2-core Xeon): batch 1 67.3 -> 83.4
(1.24x), batch 8 304.6 -> 349.7 (1.15x), batch 32 489.2 -> 528.5 (1.08x). Larger batches were
not measured, hence ``MAX_COMPILED_ROWS``.
"""

from __future__ import annotations

import logging
import os
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ferrollm.config import EngineConfigError
from ferrollm.executor.buckets import BUCKETS, bucket_for, graph_blocker
from ferrollm.layers.attention import AttentionBackend, AttentionContext
from ferrollm.layers.linear import QUANTIZED_MAX_ROWS, Linear
from ferrollm.layers.paged_attention import PagedKernelBackend, PagedKernelMetadata

if TYPE_CHECKING:
    from ferrollm.executor.kv_cache import KVCache
    from ferrollm.executor.runner import CausalLM, StepInputs

logger = logging.getLogger(__name__)

#: The largest step compiled: the largest batch measured faster compiled (module docstring).
MAX_COMPILED_ROWS = 32
#: Where the inductor caches live unless ``TORCHINDUCTOR_CACHE_DIR`` or ``FERROLLM_COMPILE_CACHE``
#: says otherwise.
DEFAULT_CACHE_DIR = Path("~/.cache/ferrollm/inductor")


#: The user's own inductor cache directory, read before `_configure_caches` points it at ours.
_USER_INDUCTOR_DIR = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def compile_cache_dir() -> Path:
    """The on-disk compile cache: ``$FERROLLM_COMPILE_CACHE``, else ``$TORCHINDUCTOR_CACHE_DIR``,
    else ``~/.cache/ferrollm/inductor``; then one subdirectory per set of CPU capabilities in
    force (`isa_tag`). Graphs compiled under an ISA cap (``make test-avx2``) and loaded by a
    process without it corrupted that process's heap: inductor's own key did not tell them
    apart."""
    value = os.environ.get("FERROLLM_COMPILE_CACHE") or _USER_INDUCTOR_DIR
    base = Path(value).expanduser() if value else DEFAULT_CACHE_DIR.expanduser()
    return base / isa_tag()


def isa_tag() -> str:
    """The CPU capabilities compiled code depends on, as a directory name: ATen's vector ISA,
    ferrollm's cap (``FERROLLM_CPU_ISA``) and oneDNN's (``ONEDNN_MAX_CPU_ISA``), e.g.
    ``cpu-avx512-native``."""
    from ferrollm import _core

    aten = torch.backends.cpu.get_cpu_capability().lower()
    tag = f"cpu-{aten}-{_core.cpu_features().cap}"
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return f"{tag}-onednn-{onednn.lower()}" if onednn else tag


def build_compiled_decode(
    mode: str,
    model: CausalLM,
    kv_cache: KVCache,
    backend: AttentionBackend,
    dtype: torch.dtype,
    max_model_len: int,
    max_num_seqs: int,
) -> CompiledDecode | None:
    """The compiled decode step ``mode`` ("auto", "on", "off"; ``EngineConfig.compile``) asks
    for, warmed up, or None.

    "auto" compiles on the CPU (the paged-kernel attention backend) in a dtype other than
    float32, and in float32 for a model whose layers run on GGUF blocks (`_has_block_weights`).
    A dense float32 model is the parity mode, where eager stays the reference: compiled float32
    matches it (same greedy tokens, logprobs within 1e-4, tested) but not bit for bit. The
    block kernels already differ from that reference by their int8 activations, and compiling
    their decode measured 1.08-1.24x (default model, float32, module docstring). "on" where it
    cannot run raises EngineConfigError naming ``compile``.
    """
    supported = isinstance(backend, PagedKernelBackend) and kv_cache.device.type == "cpu"
    blocker = graph_blocker(model)
    parity = dtype == torch.float32 and not _has_block_weights(model)
    skip = not supported or blocker is not None or parity
    if mode == "off" or (mode == "auto" and skip):
        return None
    if not isinstance(backend, PagedKernelBackend) or not supported:
        raise EngineConfigError(
            "compile",
            f"`compile` on needs the CPU's paged attention kernel; this device uses {backend.name}",
        )
    if blocker is not None:
        raise EngineConfigError("compile", f"`compile` on cannot run {blocker}")
    max_blocks = -(-max_model_len // kv_cache.block_size)
    max_rows = min(max_num_seqs, MAX_COMPILED_ROWS)
    if _has_packed_copies(model):
        max_rows = min(max_rows, QUANTIZED_MAX_ROWS)
    max_bucket = bucket_for(max_rows)
    assert max_bucket is not None
    compiled = CompiledDecode(model, kv_cache, backend, max_blocks, max_bucket)
    compiled.warm_up()
    return compiled


def _has_block_weights(model: CausalLM) -> bool:
    """Whether any of ``model``'s layers multiplies by GGUF blocks (a GGUF file's own, or a
    checkpoint quantized with ``--quantization int4|int8``)."""
    return any(isinstance(m, Linear) and m.quantized is not None for m in _modules(model))


def _has_packed_copies(model: CausalLM) -> bool:
    """Whether ``model``'s many-row steps run on oneDNN-packed weights (`prepack_dense`).

    A graph over them cannot be cached on disk (inductor bypasses its FX-graph cache:
    "mkldnn tensors unpickleable"), so it would recompile at every start (23 s for the default
    model), and compiling it gains little there: the dense matmuls dominate those steps
    (default model, offline ms per step eager -> compiled: batch 8 30.5 -> 28.5, batch 32
    54.1 -> 56.3). Such steps stay eager.
    """
    return any(isinstance(m, Linear) and m.packed is not None for m in _modules(model))


class CompiledDecode:
    """Decode steps of up to ``max_bucket`` rows through compiled graphs.

    ``backend`` is the runner's attention backend (it must be a ``PagedKernelBackend``: the
    compiled graph calls its kernel); ``max_blocks`` is the widest block table a sequence can
    have (``ceil(max_model_len / block_size)``).
    """

    def __init__(
        self,
        model: CausalLM,
        kv_cache: KVCache,
        backend: PagedKernelBackend,
        max_blocks: int,
        max_bucket: int,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.backend = backend
        self.max_blocks = max_blocks
        self.buckets = tuple(b for b in BUCKETS if b <= max_bucket)
        self.max_rows = self.buckets[-1] if self.buckets else 0
        _configure_caches()
        # The cache's block count is the one size the graphs need not know (only the attention
        # op reads the cache): left symbolic, a differently sized KV cache reuses the graphs.
        for k, v in kv_cache.layers:
            torch._dynamo.mark_dynamic(k, 0)
            torch._dynamo.mark_dynamic(v, 0)
        # LoRA's modules hold state that changes while the engine runs: fully guarded.
        frozen = not any(type(m).__name__ == "LoRALinear" for m in _modules(model))
        self._step = torch.compile(
            _own_code(self._forward),
            dynamic=False,
            fullgraph=True,
            options={"guard_filter_fn": _unguard_model} if frozen else {},
        )
        #: The one attention mode the graphs are built for: a short decode's (``accepts``).
        self.parallel = backend.parallel_for_decode(np.ones(1, dtype=np.int32))
        # Per-bucket constants: every padded step is a decode of one token per row.
        self._cu = {b: torch.arange(b + 1, dtype=torch.int32) for b in self.buckets}
        self._rows = {b: torch.arange(b, dtype=torch.int32) for b in self.buckets}

    def accepts(self, plan: StepInputs) -> bool:
        """Whether ``plan`` is a decode step this can run: one token per row, at most
        ``max_rows`` rows, block tables no wider than ``max_blocks``, attention in the mode the
        graphs were built for (on rayon's pool, a step long enough for it runs eagerly instead
        of compiling a second graph per bucket)."""
        num_tokens = len(plan.input_ids)
        num_rows = len(plan.cu_seqlens_q) - 1
        return (
            0 < num_tokens <= self.max_rows
            and num_rows == num_tokens
            and plan.block_tables.shape[1] <= self.max_blocks
            and self.backend.parallel_for_decode(plan.context_lens) == self.parallel
        )

    def run(self, plan: StepInputs) -> torch.Tensor:
        """Logits ``[plan.num_samples, vocab]`` (model dtype) of an accepted decode step;
        call under ``torch.inference_mode()``."""
        n = len(plan.input_ids)
        bucket = bucket_for(n)
        assert bucket is not None and bucket <= self.max_rows
        logits = self._run_bucket(
            bucket,
            _pad(plan.input_ids, bucket, np.int64),
            _pad(plan.positions, bucket, np.int64),
            _pad(plan.slot_mapping, bucket, np.int64),
            _pad(plan.context_lens, bucket, np.int32, fill=1),
            _pad_table(plan.block_tables, bucket, self.max_blocks),
            self.parallel,
        )
        indices = plan.logits_indices
        if len(indices) == n and bool((indices == np.arange(n)).all()):
            return logits[:n]
        return logits.index_select(0, torch.from_numpy(indices))

    def warm_up(self) -> None:
        """Compile (or load from the on-disk cache) every bucket's graph, logging the time."""
        for bucket in self.buckets:
            start = time.perf_counter()
            with torch.inference_mode():  # as ModelRunner.run: the graphs guard on it
                self._run_bucket(
                    bucket,
                    torch.zeros(bucket, dtype=torch.int64),
                    torch.zeros(bucket, dtype=torch.int64),
                    torch.zeros(bucket, dtype=torch.int64),
                    torch.ones(bucket, dtype=torch.int32),
                    torch.zeros((bucket, self.max_blocks), dtype=torch.int32),
                    self.parallel,
                )
            logger.info(
                "decode graph for %d rows ready in %.1f s", bucket, time.perf_counter() - start
            )

    def _run_bucket(
        self,
        bucket: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        context_lens: torch.Tensor,
        block_tables: torch.Tensor,
        parallel: bool,
    ) -> torch.Tensor:
        cu, rows = self._cu[bucket], self._rows[bucket]
        # The row count stays symbolic: buckets share graphs (module docstring).
        for t in (input_ids, positions, slot_mapping, context_lens, block_tables, cu, rows):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        out: torch.Tensor = self._step(
            input_ids,
            positions,
            slot_mapping,
            context_lens,
            block_tables,
            cu,
            rows,
            parallel,
        )
        return out

    def _forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        context_lens: torch.Tensor,
        block_tables: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        rows: torch.Tensor,
        parallel: bool,
    ) -> torch.Tensor:
        metadata = PagedKernelMetadata(
            slot_mapping=slot_mapping,
            positions=positions,
            cu_seqlens_q=cu_seqlens_q,
            context_lens=context_lens,
            block_tables=block_tables,
            kernel_rows=rows,
            fresh=(),
            gathered=None,
            sliding_window=self.model.sliding_window,
            parallel=parallel,
        )
        windowed = {w: replace(metadata, sliding_window=w) for w in self.model.layer_windows}
        ctx = AttentionContext(self.backend, metadata, self.kv_cache.layers, windowed)
        hidden = self.model(input_ids, positions, ctx)
        return self.model.compute_logits(hidden)


#: Where the guards `_unguard_model` drops look: the engine's model (its modules, parameters
#: and attributes, and the classes of its modules), its KV cache and its attention backend.
_FIXED_SOURCES = (
    "self.model",
    "type(self.model",
    "dict(type(self.model",
    "self.kv_cache",
    "self.backend",
)


def _unguard_model(entries: list[Any]) -> list[bool]:
    """Which of a graph's guards to keep: all but the ~11,000 on what an engine without LoRA
    never changes while it lives (`_FIXED_SOURCES`): its loaded model (modules, parameters,
    attributes, their classes), the KV cache's tensors (allocated once, their block count
    symbolic) and the attention backend (configured once). Checking the model's guards before
    every step cost 1.3 ms a step at one row (default model); the KV cache's and the
    backend's, another ~0.12 ms (Dynamo's cache lookup 355 -> 232 us a step). The guards that
    choose a graph (the row count, ``parallel``) and the module globals the model reads stay.
    Another engine's objects never meet these graphs (`_own_code`)."""
    return [not entry.name.startswith(_FIXED_SOURCES) for entry in entries]


def _own_code(method: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``method`` rebound to a copy of its function with a code object of its own: Dynamo keeps
    graphs per code object, so one engine's graphs are never tried on another's model (which
    the guards `_unguard_model` drops would have told apart)."""
    fn = method.__func__  # type: ignore[attr-defined]
    own = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    return types.MethodType(own, method.__self__)  # type: ignore[attr-defined]


def _modules(model: object) -> Iterator[object]:
    return model.modules() if isinstance(model, torch.nn.Module) else iter(())


def _pad(values: np.ndarray, size: int, dtype: type, fill: int = 0) -> torch.Tensor:
    out: np.ndarray = np.full(size, fill, dtype=dtype)
    out[: len(values)] = values
    return torch.from_numpy(out)


def _pad_table(table: np.ndarray, rows: int, width: int) -> torch.Tensor:
    out = np.zeros((rows, width), dtype=np.int32)
    out[: table.shape[0], : table.shape[1]] = table
    return torch.from_numpy(out)


def _configure_caches() -> None:
    """Point inductor's caches at ``compile_cache_dir()`` and make sure they are on."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(compile_cache_dir())
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    options: Any = torch._dynamo.config
    # A few graphs per engine (module docstring), all of one function: room for several
    # engines in one process.
    options.recompile_limit = max(options.recompile_limit, 4 * len(BUCKETS))
