"""Type stubs for the Rust core, `ferrollm._core` (checked by mypy.stubtest)."""

from collections.abc import Sequence
from typing import Any, Final, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "FINISH_REASON_NAMES",
    "QueueFullError",
    "SampleResult",
    "Sampler",
    "SamplingParams",
    "Scheduler",
    "SchedulerError",
    "StepOutput",
    "StepPlan",
    "ValidationError",
    "__version__",
]

__version__: Final[str]
#: Finish-reason names by code: 0 = not finished, 1 = stop, 2 = length, 3 = abort, 4 = timeout.
FINISH_REASON_NAMES: Final[tuple[str, str, str, str, str]]

_TokenIds = Sequence[int] | npt.NDArray[np.integer[Any]]
_Indices = Sequence[int] | npt.NDArray[np.integer[Any]]

class ValidationError(ValueError):
    """A value broke a rule; ``param`` names the field and ``code`` the rule."""

    param: str
    code: str

class QueueFullError(RuntimeError):
    """The waiting queue is full; retry later (HTTP 503)."""

class SchedulerError(RuntimeError):
    """The scheduler was misused (a stale plan) or hit an internal error."""

@final
class SamplingParams:
    """Immutable per-request parameters, validated on construction.

    ``n`` sequences are forked from the prompt; ``max_tokens`` caps each (None: until
    ``max_model_len``); EOS (unless ``ignore_eos``) and ``stop_token_ids`` end a sequence once it
    has ``min_tokens`` tokens.
    """

    def __new__(
        cls,
        *,
        n: int = 1,
        max_tokens: int | None = None,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        stop_token_ids: Sequence[int] | None = None,
    ) -> SamplingParams: ...
    @property
    def n(self) -> int: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def min_tokens(self) -> int: ...
    @property
    def ignore_eos(self) -> bool: ...
    @property
    def stop_token_ids(self) -> list[int]: ...

@final
class StepPlan:
    """One step to run, as numpy columns owning Rust buffers.

    Rows are scheduled sequences: row ``r`` computes
    ``input_ids[cu_seqlens_q[r]:cu_seqlens_q[r+1]]``
    at ``positions`` and writes their KV to ``slot_mapping``; attention reads ``context_lens[r]``
    tokens through ``block_tables[r]``. Samples are the logits to produce: one per row that
    reaches the end of its tokens (``n`` for a row whose request forks), at ``logits_indices``.
    ``block_copies[i] = (src, dst)`` must be copied before computing.
    """

    @property
    def step_id(self) -> int: ...
    @property
    def input_ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def positions(self) -> npt.NDArray[np.int64]: ...
    @property
    def slot_mapping(self) -> npt.NDArray[np.int64]: ...
    @property
    def cu_seqlens_q(self) -> npt.NDArray[np.int32]: ...
    @property
    def context_lens(self) -> npt.NDArray[np.int32]: ...
    @property
    def block_tables(self) -> npt.NDArray[np.int32]: ...
    @property
    def req_ids(self) -> npt.NDArray[np.uint64]: ...
    @property
    def seq_indices(self) -> npt.NDArray[np.uint32]: ...
    @property
    def logits_indices(self) -> npt.NDArray[np.int64]: ...
    @property
    def sample_rows(self) -> npt.NDArray[np.int32]: ...
    @property
    def sample_seq_indices(self) -> npt.NDArray[np.uint32]: ...
    @property
    def block_copies(self) -> npt.NDArray[np.int32]: ...
    @property
    def num_rows(self) -> int: ...
    @property
    def num_samples(self) -> int: ...
    @property
    def num_scheduled_tokens(self) -> int: ...
    @property
    def num_prefill_tokens(self) -> int: ...
    @property
    def num_decode_tokens(self) -> int: ...
    @property
    def preempted_req_ids(self) -> npt.NDArray[np.uint64]: ...
    @property
    def preempted_seq_indices(self) -> npt.NDArray[np.uint32]: ...
    @property
    def finished_req_ids(self) -> npt.NDArray[np.uint64]: ...
    @property
    def finished_reasons(self) -> npt.NDArray[np.uint8]: ...
    def __len__(self) -> int: ...

@final
class StepOutput:
    """What a step produced: one entry per sample, plus the requests that completed."""

    @property
    def req_ids(self) -> npt.NDArray[np.uint64]: ...
    @property
    def seq_indices(self) -> npt.NDArray[np.uint32]: ...
    @property
    def token_ids(self) -> npt.NDArray[np.uint32]: ...
    @property
    def finish_reasons(self) -> npt.NDArray[np.uint8]: ...
    @property
    def finished_req_ids(self) -> npt.NDArray[np.uint64]: ...
    def __len__(self) -> int: ...

@final
class Scheduler:
    """Continuous batching over paged KV blocks with a prefix cache, priorities and preemption.

    Each step: ``plan = s.schedule()``, run the model on the plan, sample one token per sample
    row, then ``out = s.update(plan, sampled_token_ids)``.
    """

    def __new__(
        cls,
        *,
        num_blocks: int,
        block_size: int = 16,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        max_model_len: int = 8192,
        max_num_waiting: int = 4096,
        enable_prefix_caching: bool = True,
        priority_aging_s: float = 10.0,
        eos_token_ids: Sequence[int] | None = None,
    ) -> Scheduler: ...
    def add_request(
        self,
        request_id: int,
        prompt_token_ids: _TokenIds,
        params: SamplingParams | None = None,
        *,
        priority: int = 5,
        arrival_time: float | None = None,
        deadline: float | None = None,
        cache_salt: str | None = None,
    ) -> None:
        """Queue a request. Raises ValidationError or QueueFullError."""
    def abort_request(self, request_id: int) -> bool:
        """End a request at the next schedule(); False if no such unfinished request."""
    def has_unfinished_requests(self) -> bool: ...
    def schedule(self, now: float | None = None) -> StepPlan:
        """Plan the next step; ``now`` defaults to ``time.time()``."""
    def update(self, plan: StepPlan, sampled_token_ids: _TokenIds) -> StepOutput:
        """Apply one sampled token per sample of ``plan`` (the last plan returned)."""
    def check_invariants(self) -> None:
        """Raise SchedulerError if the block accounting or the queues are inconsistent."""
    def stats(self) -> dict[str, int]: ...
    def sequences(self) -> list[dict[str, Any]]:
        """Every live sequence (for debugging and tests; not for the hot path)."""
    @property
    def block_size(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_num_batched_tokens(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...

@final
class SampleResult:
    """One step's draws as numpy columns, one entry per sample.

    ``logprobs`` is NaN where a sample did not ask for logprobs; ``top_token_ids`` and
    ``top_logprobs`` have shape ``[samples, max_k]``, padded with -1 and -inf.
    """

    @property
    def token_ids(self) -> npt.NDArray[np.uint32]: ...
    @property
    def logprobs(self) -> npt.NDArray[np.float32]: ...
    @property
    def top_token_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def top_logprobs(self) -> npt.NDArray[np.float32]: ...
    def __len__(self) -> int: ...

@final
class Sampler:
    """Draws one token per sample from a step's logits (processors, filters, seeded draw).

    ``logprobs_mode`` is ``"raw"`` (log-softmax of the unprocessed logits, vLLM's default) or
    ``"processed"`` (the distribution actually sampled from; filtered tokens at -inf).
    """

    def __new__(cls, logprobs_mode: str = "raw") -> Sampler: ...
    @property
    def logprobs_mode(self) -> str: ...
    @property
    def num_threads(self) -> int:
        """Worker threads sampling runs on (rayon's global pool)."""
    def sample(
        self,
        logits: npt.NDArray[np.float32],
        rows: _Indices,
        params: Sequence[SamplingParams],
        prompts: Sequence[_TokenIds],
        outputs: Sequence[_TokenIds],
        seeds: _Indices,
        sample_indices: _Indices | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> SampleResult:
        """Draw a token for each sample ``i`` from ``logits[rows[i]]`` (releases the GIL).

        ``logits`` must be a C-contiguous float32 ``[num_rows, vocab]`` array; it is read in
        place, never copied (other dtypes or layouts raise ValidationError). The draw is a pure
        function of ``(seeds[i], sample_indices[i], len(outputs[i]))`` and the inputs.
        """
    @staticmethod
    def process_logits(
        logits_row: npt.NDArray[np.float32],
        params: SamplingParams,
        prompt: _TokenIds,
        output: _TokenIds,
        eos_token_ids: Sequence[int] = (),
    ) -> npt.NDArray[np.float32]:
        """The row after the logits processors and temperature (a new array)."""
    @staticmethod
    def filtered_probs(
        processed_row: npt.NDArray[np.float32], params: SamplingParams
    ) -> npt.NDArray[np.float32]:
        """The exact distribution a draw uses over a processed row (zeros for removed tokens)."""
    @staticmethod
    def _params_for_tests(
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        typical_p: float = 1.0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: dict[int, float] | None = None,
        embedding_bias: Sequence[float] | None = None,
        allowed_token_ids: Sequence[int] | None = None,
        bad_words: Sequence[Sequence[int]] | None = None,
        min_tokens: int = 0,
        no_repeat_ngram_size: int = 0,
        seed: int | None = None,
        logprobs: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> SamplingParams:
        """Test-only: SamplingParams with sampling fields set directly, unvalidated."""
