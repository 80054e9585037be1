"""Type stubs for the Rust core, `ferrollm._core` (checked by mypy.stubtest)."""

import os
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "FINISH_REASON_NAMES",
    "Body",
    "CompiledGrammar",
    "CpuFeatures",
    "DecodeStream",
    "Detokenizer",
    "EngineLimits",
    "GrammarCompiler",
    "Limits",
    "NewRequest",
    "PrefillScheduler",
    "QueueFullError",
    "SampleResult",
    "Sampler",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "StepOutput",
    "StepPlan",
    "StopMatcher",
    "ValidRequest",
    "ValidationError",
    "_GgmlWeight",
    "__version__",
    "_ggml_dequantize_rows",
    "_ggml_quantize",
    "_num_body_walks",
    "_paged_attention",
    "_use_openmp",
    "cpu_features",
    "ggml_block_types",
    "ggml_kernel_paths",
    "kernel_threads",
    "truncate_at_stop",
    "validate",
]

__version__: Final[str]
#: Finish-reason names by code: 0 = not finished, 1 = stop, 2 = length, 3 = abort, 4 = timeout,
#: 5 = error (the request failed alone in a step).
FINISH_REASON_NAMES: Final[tuple[str, str, str, str, str, str]]

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

    Keyword arguments are the field names, with vLLM's ranges; None for any of them means its
    default. Values are stored normalised: ``top_k`` 0 means off (``-1`` is accepted for it),
    temperature 0 is greedy (``top_k``/``top_p``/``min_p``/``typical_p`` then read as off),
    ``best_of`` defaults to ``n``, and ``include_stop_str_in_output`` is False unless there is a
    stop string or stop token. ``max_tokens`` None means until ``max_model_len``. Token ids must
    be non-negative (``bad_words`` and ``stop_token_sequences`` are lists of token-id lists;
    ``logit_bias`` maps token ids to biases in [-100, 100]). Raises ValidationError naming
    the field.
    """

    def __new__(
        cls,
        *,
        n: int = 1,
        best_of: int | None = None,
        use_beam_search: bool = False,
        length_penalty: float = 1.0,
        early_stopping: bool | Literal["never"] = False,
        max_tokens: int | None = None,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        stop_token_ids: Sequence[int] | None = None,
        priority: int = 5,
        timeout_s: float | None = None,
        stop: str | Sequence[str] | None = None,
        stop_token_sequences: Sequence[Sequence[int]] | None = None,
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        logit_bias: Mapping[int, float] | None = None,
        embedding_bias: Sequence[float] | npt.NDArray[np.floating[Any]] | None = None,
        allowed_token_ids: Sequence[int] | None = None,
        bad_words: Sequence[Sequence[int]] | None = None,
        no_repeat_ngram_size: int = 0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        typical_p: float = 1.0,
        seed: int | None = None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        """Validated by the offline route's rules (vLLM's names and ranges); a ValidationError
        names the keyword and the rule. None for any keyword means its default."""
    @property
    def n(self) -> int:
        """Output sequences returned."""
    @property
    def best_of(self) -> int:
        """Candidate sequences generated (>= n); the beam width under beam search."""
    @property
    def use_beam_search(self) -> bool:
        """Beam search of width ``best_of`` instead of sampling."""
    @property
    def length_penalty(self) -> float:
        """Beam search: hypotheses are ranked by cumulative logprob / length ** length_penalty."""
    @property
    def early_stopping(self) -> bool | Literal["never"]:
        """Beam search: True stops when ``best_of`` hypotheses are done, False when no beam can
        beat them (heuristic), "never" only at the length limit."""
    @property
    def max_tokens(self) -> int | None:
        """Cap on generated tokens per sequence; None = until ``max_model_len``."""
    @property
    def min_tokens(self) -> int:
        """EOS and stop tokens are banned until this many tokens are generated."""
    @property
    def ignore_eos(self) -> bool:
        """Generate past EOS (until ``max_tokens`` or a stop)."""
    @property
    def stop_token_ids(self) -> list[int]:
        """Token ids that end a sequence (kept out of the text)."""
    @property
    def priority(self) -> int:
        """1 (highest) to 5 (lowest, the default)."""
    @property
    def timeout_s(self) -> float | None:
        """Seconds from arrival until the request is dropped; None = no limit."""
    @property
    def stop(self) -> list[str]:
        """Strings that end a sequence (matched on the decoded text; not in the output unless
        ``include_stop_str_in_output``)."""
    @property
    def stop_token_sequences(self) -> list[list[int]]:
        """Token-id sequences that end a sequence (TensorRT-LLM's ``stop_words_list``)."""
    @property
    def include_stop_str_in_output(self) -> bool:
        """Keep the matched stop string at the end of the text."""
    def keeping_special_tokens(self) -> SamplingParams:
        """A copy that keeps special tokens in the output text (for a tool-call parser whose
        marker is a special token)."""
    @property
    def skip_special_tokens(self) -> bool:
        """Leave special tokens out of the decoded text."""
    @property
    def spaces_between_special_tokens(self) -> bool:
        """Join special tokens to the text around them with spaces (when they are kept)."""
    @property
    def logit_bias(self) -> dict[int, float]:
        """Token id to additive bias, in id order."""
    @property
    def embedding_bias(self) -> list[float] | None:
        """Dense additive bias over the vocabulary."""
    @property
    def allowed_token_ids(self) -> list[int] | None:
        """Sorted, unique; None = every token."""
    @property
    def bad_words(self) -> list[list[int]]:
        """Token-id sequences that are never generated (the last token is banned after the rest)."""
    @property
    def no_repeat_ngram_size(self) -> int:
        """No n-gram of this size repeats in the sequence (0 = off)."""
    @property
    def repetition_penalty(self) -> float:
        """Divides positive (multiplies negative) logits of tokens already in the prompt or output;
        1.0 = off."""
    @property
    def presence_penalty(self) -> float:
        """Subtracted once from the logit of every token already generated; 0 = off."""
    @property
    def frequency_penalty(self) -> float:
        """Subtracted per occurrence from the logit of every token already generated; 0 = off."""
    @property
    def temperature(self) -> float:
        """0 = greedy."""
    @property
    def top_k(self) -> int:
        """0 = off."""
    @property
    def top_p(self) -> float:
        """Nucleus sampling: the fewest tokens whose probability reaches top_p; 1.0 = off."""
    @property
    def min_p(self) -> float:
        """Tokens below min_p times the top token's probability are dropped; 0 = off."""
    @property
    def typical_p(self) -> float:
        """Locally typical sampling mass; 1.0 = off."""
    @property
    def seed(self) -> int | None:
        """None = a random seed per request."""
    @property
    def logprobs(self) -> int | None:
        """Top alternatives returned per token (0..=20); None = no logprobs."""
    @property
    def prompt_logprobs(self) -> int | None:
        """Score the prompt: each prompt token's raw logprob, rank and this many top
        alternatives (0..=20); None = none. Such a request skips the prefix cache."""

@final
class Limits:
    """Server and model limits that requests are validated against; immutable.

    ``max_model_len`` is MindIE's ``maxSeqLen``, ``max_input_tokens`` its ``maxInputTokenLen``
    and ``max_iter_times`` its ``maxIterTimes``. ``vocab_size`` 0 means unknown (the checks
    that need it are skipped). ``multimodal`` False rejects media content parts.
    ``databricks_endpoint_type`` is "pay_per_token", "provisioned_throughput" or None (both
    ``n`` and ``error_behavior`` accepted). ``embedding_dimensions`` is an embedding model's
    vector length, the only ``dimensions`` ``/v1/embeddings`` accepts (0: not an embedding
    model). Raises ValidationError naming the field.
    """

    def __new__(
        cls,
        *,
        max_model_len: int = 8192,
        max_input_tokens: int = 8192,
        max_position_embeddings: int | None = None,
        max_iter_times: int = 8192,
        vocab_size: int = 0,
        max_prompt_chars: int = 4194304,
        max_stop_chars: int = 32768,
        max_n: int = 128,
        max_logprobs: int = 20,
        max_tools_databricks: int = 32,
        max_beam_width: int = 128,
        multimodal: bool = False,
        databricks_endpoint_type: str | None = None,
        embedding_dimensions: int = 0,
    ) -> Limits:
        """Every limit by keyword (the defaults are the documented ones, docs/api/common.md);
        ValidationError naming a limit out of range."""
    @property
    def max_model_len(self) -> int:
        """MindIE ``maxSeqLen``: prompt plus output tokens per sequence."""
    @property
    def max_input_tokens(self) -> int:
        """MindIE ``maxInputTokenLen``: prompt tokens at most."""
    @property
    def max_position_embeddings(self) -> int | None:
        """The model's position limit (None: unknown)."""
    @property
    def max_iter_times(self) -> int:
        """MindIE ``maxIterTimes``: generated tokens at most, and the ``/v1`` default
        ``max_tokens``."""
    @property
    def vocab_size(self) -> int:
        """The model's vocabulary (0: unknown; token-id checks are skipped)."""
    @property
    def max_prompt_chars(self) -> int:
        """Characters of prompt text at most (4 MiB by default)."""
    @property
    def max_stop_chars(self) -> int:
        """Characters of all stop strings together at most."""
    @property
    def max_n(self) -> int:
        """Largest ``n`` / ``best_of``."""
    @property
    def max_logprobs(self) -> int:
        """Largest ``logprobs`` / ``top_logprobs``."""
    @property
    def max_tools_databricks(self) -> int:
        """Most tools a Databricks chat may declare."""
    @property
    def max_beam_width(self) -> int:
        """Widest beam search a route accepts."""
    @property
    def multimodal(self) -> bool:
        """Whether media content parts are accepted (False: a 400 naming the part)."""
    @property
    def max_prompt_tokens(self) -> int:
        """``min(max_input_tokens, max_model_len - 1, max_position_embeddings, 1048576)``:
        the most prompt tokens a request may have (docs/api/common.md#prompt-limits)."""
    @property
    def databricks_endpoint_type(self) -> str | None:
        """ "pay_per_token", "provisioned_throughput" or None (both ``n`` and ``error_behavior``
        accepted)."""
    @property
    def embedding_dimensions(self) -> int:
        """An embedding model's vector length, the one ``dimensions`` accepted (0: not an embedding
        model)."""

@final
class Body:
    """A request body parsed from its JSON bytes, ready for `validate`: the body's one walk."""

    @staticmethod
    def parse(data: bytes) -> Body:
        """Parse ``data`` (a JSON object's bytes) without the GIL. Raises ValidationError with
        code ``invalid_json`` (malformed or empty; ``param`` ""), ``wrong_type`` (not an
        object; ``param`` ""), ``duplicate_key`` (a key repeated in one object; ``param`` the
        key) or ``invalid_format`` (nested more than 64 levels; ``param`` its path)."""
    def databricks_route(self) -> str:
        """The Databricks task the body's shape asks for: "databricks_chat" (``messages``),
        "databricks_completions" (``prompt``) or "databricks_embeddings" (``input``);
        ValidationError unless exactly one of them is given."""

def validate(
    route: str,
    body: Body | Mapping[str, Any],
    limits: Limits | None = None,
) -> ValidRequest:
    """Validate a request body of ``route`` once: its parameters, its route switches, and the
    features this build serves (the one capability check: ``code`` ``unsupported``).

    ``body`` is a parsed `Body` (the HTTP routes) or a Python value (the offline and TRT
    requests, converted once). ``route`` is "generate", "generate_stream", "chat",
    "completions", "databricks_chat", "databricks_completions", "databricks_embeddings",
    "embeddings" (``/v1/embeddings``), "trt" or "offline". Each route keeps its own ranges.
    The rules that need the prompt's token count come after tokenizing:
    ``ValidRequest.fit_prompt`` / ``with_prompt_tokens`` apply the prompt-token limit and the
    output cap ``min(max_tokens or the route default, max_iter_times, max_model_len -
    prompt_tokens)`` (``check_input_tokens`` the embeddings limits). Raises ValidationError
    whose ``param`` is the field path as the client wrote it (``messages[0].content[1].type``)
    and whose ``code`` is a stable tag (``out_of_range``, ``wrong_type``, ``missing``,
    ``too_long``, ``empty``, ``conflict``, ``unsupported_content_type``, ``invalid_format``,
    ``invalid_value``, ``too_many``, ``unsupported``, ``unknown_field``).
    """

def _num_body_walks() -> int:
    """Whole request bodies walked (parsed or converted) since start-up; private, for the test
    that holds each request to one walk."""

@final
class EngineLimits:
    """The engine's own bounds, beyond a route's `Limits`: its widest beam and its model's
    hidden size (the width of a prompt table's rows)."""

    def __new__(cls, *, max_beam_width: int, hidden_size: int) -> EngineLimits:
        """The engine's bounds: ``max_beam_width`` and the model's ``hidden_size``."""
    @property
    def max_beam_width(self) -> int:
        """Widest beam search the engine runs."""
    @property
    def hidden_size(self) -> int:
        """The model's hidden size (a prompt table's row width)."""
    def admit(
        self,
        params: SamplingParams,
        return_generation_logits: bool = False,
        prompt_table_shape: Sequence[int] | None = None,
    ) -> int:
        """Admit a request with ``params`` before it is queued (every path: HTTP, offline,
        TRT): a beam wider than ``max_beam_width`` (naming ``best_of``), beam search with
        ``return_generation_logits``, or a prompt table not ``[rows >= 1, hidden_size]`` is a
        ValidationError naming the field. Returns the table's rows (0 without one)."""

@final
class ValidRequest:
    """A request body that passed its route's rules: the parameters and every route switch.

    Messages, tools and prompts are handed out from the validated body.
    """

    @property
    def route(self) -> str:
        """The route name it was validated for."""
    @property
    def params(self) -> SamplingParams:
        """The parameters before the prompt-token rules (``max_tokens`` capped by
        ``max_iter_times`` only; the offline route leaves it as given)."""
    @property
    def stream(self) -> bool:
        """Stream the response as server-sent events."""
    @property
    def model(self) -> str | None:
        """The ``model`` the client named (``/v1`` routes), or None."""
    @property
    def echo(self) -> bool:
        """Completions ``echo``: the prompt comes before the generated text."""
    @property
    def suffix(self) -> str | None:
        """Completions ``suffix``, or None."""
    @property
    def truncate(self) -> bool:
        """Databricks ``error_behavior: "truncate"``."""
    @property
    def details(self) -> bool:
        """MindIE ``parameters.details``."""
    @property
    def client_id(self) -> str | None:
        """MindIE's client ``id``."""
    @property
    def is_batch(self) -> bool:
        """Whether ``prompt`` (or ``input``) is a list of prompts (a list of token ids is one
        prompt)."""
    @property
    def score_only(self) -> bool:
        """Completions ``max_tokens: 0`` with ``echo``: score the prompt, return no tokens."""
    @property
    def prompt_logprobs(self) -> int | None:
        """vLLM's ``prompt_logprobs`` extra as sent: the response's ``prompt_logprobs`` field."""
    @property
    def grammar(self) -> tuple[str, str, str] | None:
        """Structured output: ``(kind, text, field)`` of the grammar the output must follow
        (``GrammarCompiler.compile``'s arguments), or None."""
    @property
    def messages(self) -> Any:
        """The chat messages (a list of message objects), or None."""
    @property
    def template_messages(self) -> list[dict[str, Any]]:
        """The chat messages as the template renders them: content parts joined into text,
        ``name`` and ``tool_call_id`` when given, tool-call ``arguments`` as objects (a string
        that is not JSON stays a string); empty without messages."""
    @property
    def chat_template_kwargs(self) -> dict[str, Any] | None:
        """vLLM's ``chat_template_kwargs`` on chat (keyword arguments for the chat template,
        e.g. ``enable_thinking``), or None."""
    @property
    def instruction(self) -> str | None:
        """The Databricks embeddings ``instruction`` (prepended to every input), or None."""
    @property
    def tools(self) -> Any:
        """The tools for the chat template when the body has any, else None."""
    @property
    def tool_choice(self) -> Any:
        """``tool_choice`` as sent (a string or a function object), or None."""
    @property
    def response_format(self) -> Any:
        """``response_format`` as sent, or None."""
    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts: texts (``prompt``/``input``, or ``text_input`` with its text parts
        joined) or, on ``/v1/completions`` and ``/v1/embeddings``, lists of token ids; empty
        for chat."""
    @property
    def encoding_format(self) -> str:
        """``/v1/embeddings`` ``encoding_format``: "float" or "base64"."""
    @property
    def truncate_prompt_tokens(self) -> int | None:
        """``/v1/embeddings`` ``truncate_prompt_tokens`` resolved (-1 is the model's maximum);
        None when not asked."""
    def check_input_tokens(self, lengths: Sequence[int]) -> int:
        """The token limits of an embeddings request once its inputs are tokenized (and cut):
        each input at most ``max_input_tokens`` (the error names ``input[i]``), all together at
        most 300,000 (it names ``input``). Returns the total."""
    def with_prompt_tokens(
        self, num_prompt_tokens: int, index: int | None = None
    ) -> SamplingParams:
        """The parameters for a prompt of ``num_prompt_tokens`` tokens: the prompt-token limit
        and the output cap; an error names ``prompt[index]`` in a batch."""
    def fit_prompt(
        self, token_ids: Sequence[int] | npt.NDArray[np.integer], index: int | None = None
    ) -> tuple[npt.NDArray[np.uint32], SamplingParams]:
        """The prompt's token ids (cut from the left under ``error_behavior: "truncate"``) as a
        uint32 array, and ``with_prompt_tokens`` for them."""

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
    def step_id(self) -> int:
        """The step's number, counting from 0."""
    @property
    def input_ids(self) -> npt.NDArray[np.int64]:
        """The tokens to compute, every row's in row order."""
    @property
    def positions(self) -> npt.NDArray[np.int64]:
        """Each input token's position in its sequence."""
    @property
    def slot_mapping(self) -> npt.NDArray[np.int64]:
        """Each input token's KV-cache slot (block * block_size + offset)."""
    @property
    def cu_seqlens_q(self) -> npt.NDArray[np.int32]:
        """Row boundaries in ``input_ids``: row r is ``[cu_seqlens_q[r], cu_seqlens_q[r+1])``."""
    @property
    def context_lens(self) -> npt.NDArray[np.int32]:
        """Each row's tokens visible to attention (cached plus new)."""
    @property
    def block_tables(self) -> npt.NDArray[np.int32]:
        """``[rows, max_blocks]`` KV block ids per row, padded with the null block 0."""
    @property
    def req_ids(self) -> npt.NDArray[np.uint64]:
        """Each row's request id (the scheduler's integer id)."""
    @property
    def seq_indices(self) -> npt.NDArray[np.uint32]:
        """Each row's sequence index within its request."""
    @property
    def lora_ids(self) -> npt.NDArray[np.uint32]:
        """Each row's LoRA adapter (its request's ``lora_id``; 0 = the base model)."""
    @property
    def num_draft_tokens(self) -> npt.NDArray[np.uint32]:
        """Draft tokens at the end of each row (speculative decoding; 0 = none): such a row's
        last ``1 + num_draft_tokens`` positions are all sampled, in order."""
    @property
    def logits_indices(self) -> npt.NDArray[np.int64]:
        """The rows of the model's hidden states to turn into logits, one per sample."""
    @property
    def sample_rows(self) -> npt.NDArray[np.int32]:
        """Each sample's row."""
    @property
    def sample_seq_indices(self) -> npt.NDArray[np.uint32]:
        """Each sample's sequence index (a forking row has several)."""
    @property
    def block_copies(self) -> npt.NDArray[np.int32]:
        """``[k, 2]`` (src, dst) KV blocks to copy before computing (copy-on-write)."""
    @property
    def num_rows(self) -> int:
        """Rows (sequences) in the step."""
    @property
    def num_samples(self) -> int:
        """Samples (logit rows) the step produces."""
    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens computed in the step."""
    @property
    def num_prefill_tokens(self) -> int:
        """Of those, prompt tokens."""
    @property
    def num_decode_tokens(self) -> int:
        """Of those, one per decoding row."""
    @property
    def num_encoder_tokens(self) -> int:
        """Media positions whose encoder work the step starts (the spans its prefill chunks
        first reach into; at most ``max_num_encoder_tokens`` unless one span is longer)."""
    @property
    def preempted_req_ids(self) -> npt.NDArray[np.uint64]:
        """Requests preempted this step (their KV freed; they recompute)."""
    @property
    def preempted_seq_indices(self) -> npt.NDArray[np.uint32]:
        """The preempted sequences' indices."""
    @property
    def finished_req_ids(self) -> npt.NDArray[np.uint64]:
        """Requests that ended before computing (aborted, past their deadline)."""
    @property
    def finished_reasons(self) -> npt.NDArray[np.uint8]:
        """Their finish reasons (codes of ``FINISH_REASON_NAMES``)."""
    def __len__(self) -> int: ...

@final
class StepOutput:
    """What a step produced: one entry per sample, plus the requests that completed."""

    @property
    def req_ids(self) -> npt.NDArray[np.uint64]:
        """Each sample's request id."""
    @property
    def seq_indices(self) -> npt.NDArray[np.uint32]:
        """Each sample's sequence index within its request."""
    @property
    def token_ids(self) -> npt.NDArray[np.uint32]:
        """Each sample's drawn token."""
    @property
    def finish_reasons(self) -> npt.NDArray[np.uint8]:
        """FINISH_REASON_NAMES code if the sequence ended with this token, else 0."""
    @property
    def text(self) -> str:
        """The text deltas of all samples, concatenated (see ``text_offsets``)."""
    @property
    def text_offsets(self) -> npt.NDArray[np.uint32]:
        """Sample ``i``'s delta is ``text[text_offsets[i]:text_offsets[i + 1]]`` (code points)."""
    @property
    def stop_str_indices(self) -> npt.NDArray[np.int32]:
        """Index into the request's ``stop`` of the string that ended the sequence, else -1."""
    @property
    def stop_token_ids(self) -> npt.NDArray[np.int64]:
        """The id from the request's ``stop_token_ids`` that ended the sequence, else -1.

        vLLM's rule: EOS is no stop reason (unless ``ignore_eos``), and a stop string wins."""
    @property
    def logprobs(self) -> npt.NDArray[np.float32]:
        """Logprob of each appended token; NaN when the request needs none (it asked for no
        logprobs and does not rank ``best_of`` > ``n`` candidates by their sum)."""
    @property
    def sequence_scores(self) -> npt.NDArray[np.float32]:
        """Beam search: on the last token of each emitted hypothesis its score
        (``sum_logprobs / generated_len ** length_penalty``); else NaN."""
    @property
    def top_token_ids(self) -> npt.NDArray[np.int32]:
        """``[samples, k]`` best alternatives, best first, padded with -1."""
    @property
    def top_logprobs(self) -> npt.NDArray[np.float32]:
        """``[samples, k]`` logprobs of ``top_token_ids``, padded with -inf."""
    @property
    def logprob_bytes(self) -> bytes:
        """The bytes each logprob entry's token stands for, concatenated: per sample the chosen
        token, then its ``k`` alternatives (empty for padding and for samples without
        logprobs); see ``logprob_byte_offsets``."""
    @property
    def logprob_byte_offsets(self) -> npt.NDArray[np.uint32]:
        """``samples * (1 + k) + 1`` boundaries of the entries in ``logprob_bytes``."""
    @property
    def finished_req_ids(self) -> npt.NDArray[np.uint64]:
        """Requests whose every sequence has now finished (failed ones are not among them)."""
    @property
    def failed_req_ids(self) -> npt.NDArray[np.uint64]:
        """Requests that failed alone in this step (for example a row left with no finite
        logit by their processors); their blocks are freed and their state is gone."""
    @property
    def failed_messages(self) -> list[str]:
        """Why each of ``failed_req_ids`` failed; the message names the field."""
    @property
    def failed_errors(self) -> list[ValidationError]:
        """Each of ``failed_req_ids``' error as an exception, with the ``param`` and ``code``
        of the rule it broke (``str(error)`` is its ``failed_messages`` entry)."""
    @property
    def held_req_ids(self) -> npt.NDArray[np.uint64]:
        """Requests that advanced in this step with every new token held back: a ``best_of`` >
        ``n`` request's candidates, shown (the best ``n``, ranked by cumulative logprob, as
        sequences ``0..n``) in the step where the last of them finishes."""
    def __len__(self) -> int: ...

@final
class SchedulerConfig:
    """Everything that bounds a Scheduler; checked on construction (errors name the field)."""

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
        eos_token_ids: _TokenIds = (),
        logprobs_mode: str = "raw",
        vocab_size: int = 0,
        seed: int | None = None,
        speculative: str | None = None,
        num_speculative_tokens: int = 4,
        ngram_min: int = 1,
        ngram_max: int = 3,
        max_loras: int = 0,
        max_num_encoder_tokens: int | None = None,
    ) -> SchedulerConfig:
        """``speculative="ngram"`` turns on prompt-lookup speculative decoding: each decode
        row carries up to ``num_speculative_tokens`` draft tokens, the continuation of the
        latest earlier occurrence of the longest ``ngram_min..ngram_max``-gram ending the
        sequence, verified in the same step. ``logprobs_mode`` is ``"raw"`` (vLLM's default:
        log-softmax of the model's logits) or ``"processed"`` (the distribution actually
        sampled from). ``vocab_size`` (0 =
        unknown) lets ``add_request`` reject prompts and parameters that do not fit the model.
        ``seed`` makes the seeds of unseeded requests deterministic, so a run replays.
        ``max_loras`` (0 = no limit) caps the distinct LoRA adapters (requests' ``lora_id``
        other than 0) running at once: a waiting request on another adapter waits.
        ``max_num_encoder_tokens`` (None = ``max(max_num_batched_tokens, 4096)``) caps the
        media positions whose encoding a step starts: a prefill chunk that would reach into a
        media span the rest of the budget cannot cover ends before the span (the first span a
        step starts always runs, however long)."""
    @property
    def num_blocks(self) -> int:
        """KV blocks in the pool, the null block included."""
    @property
    def block_size(self) -> int:
        """Token slots per KV block."""
    @property
    def max_num_seqs(self) -> int:
        """Running sequences per step, at most."""
    @property
    def max_num_batched_tokens(self) -> int:
        """Tokens computed per step, at most (the token budget)."""
    @property
    def max_model_len(self) -> int:
        """Prompt + output tokens of one sequence, at most."""
    @property
    def max_num_waiting(self) -> int:
        """Waiting sequences beyond which ``add_request`` raises QueueFullError."""
    @property
    def enable_prefix_caching(self) -> bool:
        """Whether full blocks are reused across requests with the same prefix."""
    @property
    def priority_aging_s(self) -> float:
        """Seconds of waiting per level of priority gained; 0 turns aging off."""
    @property
    def eos_token_ids(self) -> list[int]:
        """End-of-sequence token ids of the model."""
    @property
    def logprobs_mode(self) -> str:
        """``"raw"`` or ``"processed"``."""
    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size (its logits' width); 0 = unknown."""
    @property
    def seed(self) -> int | None:
        """Seed of the seeds of unseeded requests; None = OS-random."""
    @property
    def speculative(self) -> str | None:
        """``"ngram"`` when prompt-lookup speculative decoding is on, else None."""
    @property
    def num_speculative_tokens(self) -> int:
        """Draft tokens the n-gram drafter proposes per step, at most."""
    @property
    def ngram_min(self) -> int:
        """Shortest n-gram the drafter matches."""
    @property
    def ngram_max(self) -> int:
        """Longest n-gram the drafter matches."""
    @property
    def max_loras(self) -> int:
        """Distinct LoRA adapters running at once, at most (0 = no limit)."""
    @property
    def max_num_encoder_tokens(self) -> int:
        """Encoder tokens (media span positions) whose encoding a step may start, at most."""

@final
class CompiledGrammar:
    """A compiled grammar's initial state; each request that uses it follows its own copy."""

    def check_tokens(self, token_ids: Sequence[int]) -> tuple[int, bool]:
        """How many of ``token_ids`` the grammar takes in order from its start (it stops at
        the first it refuses), and whether it could end right after them."""

@final
class GrammarCompiler:
    """Compiles structured-output grammars for one tokenizer (thread-safe; the GIL is released
    while compiling; compiled grammars are cached by kind and text). ``eos_token_ids`` end a
    constrained output where its grammar accepts."""

    def __new__(cls, tokenizer: Detokenizer, eos_token_ids: Sequence[int]) -> GrammarCompiler:
        """A compiler for ``tokenizer``'s vocabulary (llguidance); ``eos_token_ids`` end a
        constrained output."""
    def compile(self, kind: str, text: str, field: str) -> CompiledGrammar:
        """Compile a grammar of ``kind`` ("json_object", "json_schema", "regex", "choice" (a
        JSON list of strings), "lark") from ``text``. A source that does not parse, or one past
        the compile limits, raises ValidationError naming ``field``."""
    @property
    def vocab_size(self) -> int:
        """Tokens the compiled masks cover."""

@final
class Scheduler:
    """Continuous batching over paged KV blocks with a prefix cache, priorities and preemption.

    Each step: ``plan = s.schedule()``, run the model on the plan, then either
    ``out = s.update_with_logits(plan, logits)`` (sampled in Rust) or
    ``out = s.update(plan, sampled_token_ids)``.
    """

    def __new__(cls, config: SchedulerConfig, tokenizer: Detokenizer | None = None) -> Scheduler:
        """``tokenizer`` turns appended tokens into text deltas and enables stop strings."""
    def add_request(self, request: NewRequest) -> None:
        """Queue a request. Raises ValidationError or QueueFullError; nothing is queued then.

        With the config's ``vocab_size`` known, prompts and parameters naming tokens beyond it
        (or an ``embedding_bias`` of another length) are rejected here; so are drafts with beam
        search or a grammar, and a beam group the KV cache could never hold."""
    def abort_request(self, request_id: int) -> bool:
        """End a request at the next schedule(); False if no such unfinished request."""
    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running."""
    def waiting_order(self, now: float | None = None) -> list[int]:
        """The waiting requests' ids in the order they would be admitted at ``now`` (default
        ``time.time()``): priority with aging, then arrival, a preempted request first in its
        level. A request's index is its place in the queue."""
    def schedule(self, now: float | None = None) -> StepPlan:
        """Plan the next step; ``now`` defaults to ``time.time()``."""
    def update(self, plan: StepPlan, token_ids: _TokenIds) -> StepOutput:
        """Finish the step of ``plan`` (the last plan returned) with one sampled token id per
        sample: tokens are appended, detokenized (with a tokenizer), checked against stops,
        and finished requests are released."""
    def update_with_logits(self, plan: StepPlan, logits: npt.NDArray[np.float32]) -> StepOutput:
        """Like ``update``, sampling every row in Rust from the step's float32 logits
        ``[plan.num_samples, vocab]`` (row ``i`` for sample ``i``; C-contiguous, read in place).

        A row that cannot be sampled (no finite logit left after its request's processors, or
        parameters that do not fit ``vocab``) fails its request alone: it is reported in
        ``failed_req_ids``/``failed_messages`` and the other samples are applied. A stale plan
        or a logits shape that does not match fails the call, changing nothing."""
    def check_invariants(self) -> None:
        """Raise SchedulerError if the block accounting or the queues are inconsistent."""
    def stats(self) -> dict[str, int]:
        """Counters as of now: running and waiting sequences, KV blocks used/free/cached,
        prefix-cache queries and hits, preemptions, steps."""
    def sequences(self) -> list[dict[str, Any]]:
        """Every live sequence (for debugging and tests; not for the hot path)."""
    @property
    def block_size(self) -> int:
        """Tokens per KV block."""
    @property
    def num_blocks(self) -> int:
        """KV blocks in the pool (block 0 is the null block)."""
    @property
    def max_num_seqs(self) -> int:
        """Sequences per step at most."""
    @property
    def max_num_batched_tokens(self) -> int:
        """Tokens per step at most."""
    @property
    def max_model_len(self) -> int:
        """Prompt plus output tokens per sequence at most."""
    @property
    def config(self) -> SchedulerConfig:
        """The configuration this scheduler was built with."""

@final
class NewRequest:
    """One request for ``Scheduler.add_request`` or ``PrefillScheduler.add_request``: its
    values' types are checked here, their meaning when it is added."""

    def __new__(
        cls,
        request_id: int,
        prompt_token_ids: _TokenIds,
        params: SamplingParams | None = None,
        *,
        priority: int | None = None,
        arrival_time: float | None = None,
        deadline: float | None = None,
        cache_salt: str | None = None,
        grammar: CompiledGrammar | None = None,
        draft_tokens: _TokenIds | None = None,
        draft_logits: npt.NDArray[np.float32] | None = None,
        num_virtual_tokens: int = 0,
        lora_id: int = 0,
        media: Sequence[tuple[int, int, str]] | None = None,
    ) -> NewRequest:
        """``priority`` defaults to ``params.priority``; ``arrival_time`` to ``time.time()`` when
        the request is made; ``deadline`` to arrival + ``params.timeout_s`` when that is set.

        ``draft_tokens`` (speculative decoding) is a guess of the output's first tokens,
        verified by the model while the output follows it; ``draft_logits``
        (``[len(draft_tokens), vocab]`` float32) are the drafter's logits at each of them, for
        the speculative-sampling acceptance rule at temperature > 0. ``cache_salt``: requests
        share prefix-cache blocks only with requests of the same salt. ``num_virtual_tokens``
        (p-tuning) admits prompt ids up to ``vocab_size + num_virtual_tokens``, which the
        model runner embeds from the request's prompt table. ``lora_id`` (0 = none) is the
        LoRA adapter the request runs on, as the caller numbers them (never reusing a number
        for other weights): it salts the prefix cache and counts towards ``max_loras``.
        ``media`` lists the prompt's media spans as ``(offset, length, digest)``: sorted,
        non-overlapping, non-empty, within the prompt (else ValidationError naming ``media``);
        the digest names the item's content. A full KV block's prefix-cache key mixes in the
        digests of the spans it overlaps, and a span's length counts against
        ``max_num_encoder_tokens`` in the step whose chunk first reaches into it."""
    @property
    def request_id(self) -> int:
        """The caller's id."""
    @property
    def num_prompt_tokens(self) -> int:
        """Tokens in the prompt."""
    @property
    def arrival_time(self) -> float:
        """When the request arrived (seconds, the clock ``schedule(now)`` uses)."""

@final
class PrefillScheduler:
    """Prefill-only scheduling for embedding models: each request is one whole forward over
    its prompt, packed into steps in rank order by the token budget and seats, never chunked,
    and ended by ``update(plan, [])`` with its blocks freed (nothing is sampled or kept).

    Its config needs ``max_model_len <= max_num_batched_tokens`` and no prefix caching; a
    prompt over ``max_model_len``, more than one candidate, beam search, a grammar or draft
    tokens are refused by ``add_request``.
    """

    def __new__(cls, config: SchedulerConfig) -> PrefillScheduler:
        """A scheduler over an empty pool of ``config.num_blocks`` blocks; a config that breaks
        the prefill-only rules raises ValidationError naming the field."""
    def add_request(self, request: NewRequest) -> None:
        """Queue an input. Raises ValidationError or QueueFullError; nothing is queued then."""
    def abort_request(self, request_id: int) -> bool:
        """End an input at the next schedule(); False if no such unfinished input."""
    def has_unfinished_requests(self) -> bool:
        """Whether any input is waiting or in a plan."""
    def schedule(self, now: float | None = None) -> StepPlan:
        """Plan the next step (its rows sample nothing); ``now`` defaults to ``time.time()``.
        The rows of a plan never passed to ``update`` are planned again."""
    def update(self, plan: StepPlan, token_ids: _TokenIds) -> StepOutput:
        """End every row of ``plan`` (the last plan returned; ``token_ids`` must be empty):
        their requests are listed in ``finished_req_ids``, in row order."""
    def check_invariants(self) -> None:
        """Raise SchedulerError if the block accounting or the queue is inconsistent."""
    def stats(self) -> dict[str, int]:
        """``Scheduler.stats()``-shaped counters: inputs in the plan and waiting, KV blocks
        used and free, steps (the others are 0)."""
    @property
    def config(self) -> SchedulerConfig:
        """The configuration this scheduler was built with."""

@final
class Detokenizer:
    """A tokenizer.json loaded for incremental detokenization; load once per model and share.

    ``decode`` is the all-at-once reference text. With ``skip_special_tokens`` special tokens
    are dropped (equal to ``tokenizers.Tokenizer.decode(ids, skip_special_tokens=True)``);
    without it each run of normal tokens is decoded on its own and each special token is its
    own segment, the segments joined with ``" "`` if ``spaces_between_special_tokens`` else
    ``""`` (vLLM's convention). Ids that no token has are ignored. Byte-level tokenizers
    (GPT-2, Qwen, Llama-3) stream through a per-token byte table (``has_fast_path``).
    """

    @staticmethod
    def from_file(path: str | os.PathLike[str]) -> Detokenizer:
        """Load a tokenizer.json file; a bad file raises ValidationError(param="tokenizer")."""
    @staticmethod
    def from_str(json: str) -> Detokenizer:
        """Load tokenizer.json contents; invalid JSON raises ValidationError."""
    def decode(
        self,
        token_ids: _TokenIds,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        """The text of ``token_ids`` all at once: what a stream's deltas concatenate to."""
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the post-processor."""
    @property
    def vocab_size(self) -> int:
        """One past the largest token id, added tokens included."""
    @property
    def has_fast_path(self) -> bool:
        """Whether streams use the byte-level fast path."""
    def is_special(self, token_id: int) -> bool:
        """Whether ``token_id`` is a special token (dropped by ``skip_special_tokens``)."""
    def token_text(self, token_id: int) -> str:
        """The text one token stands for (for logprobs); half a character is U+FFFD."""
    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (OpenAI logprobs ``bytes``)."""
    def stream(
        self, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> DecodeStream:
        """A new per-sequence stream with these flags."""

@final
class DecodeStream:
    """One sequence's incremental detokenization, from ``Detokenizer.stream()``.

    Each call returns the text that became final (possibly ``""``); no delta ever holds half a
    UTF-8 character, and the deltas plus ``finish()`` concatenate to ``Detokenizer.decode``
    of all ids with the same flags.
    """

    def step(self, token_id: int) -> str:
        """Add one token; return the text it completed."""
    def push(self, token_ids: _TokenIds) -> str:
        """Add many tokens at once; return the text they completed."""
    def finish(self) -> str:
        """End the sequence: return what was held back and reset the stream."""

@final
class StopMatcher:
    """Finds the first stop string in one sequence's text as it streams in.

    The stop that completes first (earliest end; then the longest; then the first listed) ends
    the text: output stops just before it, or just after it with
    ``include_stop_str_in_output``. Only the longest tail that could still start a stop is held
    back, so the result does not depend on how the text is split into deltas. An empty ``stop``
    makes a pass-through; an empty string in it raises ValidationError.
    """

    def __new__(cls, stop: Sequence[str], include_stop_str_in_output: bool = False) -> StopMatcher:
        """A matcher of ``stop`` (an empty list matches nothing)."""
    def push(self, delta: str) -> tuple[str, str | None]:
        """Feed the next delta; return the text now safe to emit and the matched stop string.

        After a match (or ``finish()``) further pushes return ``("", None)``.
        """
    def finish(self) -> str:
        """Return the held-back tail: the text has ended, so no stop can complete any more."""
    @property
    def stopped(self) -> bool:
        """True once a stop string has matched."""
    @property
    def held(self) -> str:
        """The text held back because a stop could still start in it."""

def truncate_at_stop(
    text: str, stop: Sequence[str], include_stop_str_in_output: bool = False
) -> tuple[str, str | None]:
    """The whole-text result of the stop rule: ``(text up to the stop, matched stop or None)``."""

@final
class SampleResult:
    """One step's draws as numpy columns, one entry per sample.

    ``logprobs`` is NaN where a sample needs none (no ``logprobs``, no ``best_of`` > ``n``);
    ``top_token_ids`` and ``top_logprobs`` have shape ``[samples, max_k]``, padded with -1 and
    -inf.
    """

    @property
    def token_ids(self) -> npt.NDArray[np.uint32]:
        """The drawn token per sample."""
    @property
    def logprobs(self) -> npt.NDArray[np.float32]:
        """Each drawn token's logprob (NaN where none was asked)."""
    @property
    def top_token_ids(self) -> npt.NDArray[np.int32]:
        """``[samples, max_k]`` top alternatives per sample, padded with -1."""
    @property
    def top_logprobs(self) -> npt.NDArray[np.float32]:
        """``[samples, max_k]`` their logprobs, padded with -inf."""
    def __len__(self) -> int: ...

@final
class Sampler:
    """Draws one token per sample from a step's logits (processors, filters, seeded draw).

    ``logprobs_mode`` is ``"raw"`` (log-softmax of the unprocessed logits, vLLM's default) or
    ``"processed"`` (the distribution actually sampled from; filtered tokens at -inf).
    """

    def __new__(cls, logprobs_mode: str = "raw") -> Sampler:
        """A sampler whose logprobs are ``logprobs_mode``: "raw" or "processed"."""
    @property
    def logprobs_mode(self) -> str:
        """ "raw" or "processed"."""
    @property
    def num_threads(self) -> int:
        """Worker threads sampling runs on (rayon's global pool)."""
    def sample(
        self,
        logits: npt.NDArray[np.float32],
        rows: _Indices,
        params: Sequence[SamplingParams],
        tokens: tuple[Sequence[_TokenIds], Sequence[_TokenIds]],
        seeds: _Indices,
        extra: tuple[_Indices | None, Sequence[int] | None] | None = None,
    ) -> SampleResult:
        """Draw a token for each sample ``i`` from ``logits[rows[i]]`` (releases the GIL).

        ``tokens`` is ``(prompts, outputs)``, a token list each per sample; ``extra`` is
        ``(sample_indices, eos_token_ids)`` (either None). ``logits`` must be a C-contiguous
        float32 ``[num_rows, vocab]`` array; it is read in place, never copied (other dtypes or
        layouts raise ValidationError). The draw is a pure function of ``(seeds[i],
        sample_indices[i], len(outputs[i]))`` and the inputs. ``ferrollm.testing.Sampler``
        spells the columns out.
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

@final
class CpuFeatures:
    """This process's CPU features, detected once from the CPU itself and capped by the
    ``FERROLLM_CPU_ISA`` environment variable (``native``, the default; ``avx2``: as an
    AVX2-only CPU; ``baseline``: no AVX2). The Rust kernels and the torch paths both follow it."""

    @property
    def cap(self) -> str:
        """The cap in force: "native", "avx2" or "baseline"."""
    @property
    def names(self) -> list[str]:
        """The features present and allowed, as ``/proc/cpuinfo`` names them (``avx2``,
        ``fma``, ``f16c``, ``avx_vnni``, ``avx_ne_convert``, ``avx512f``, ``avx512bw``,
        ``avx512vl``, ``avx512dq``, ``avx512_vnni``, ``avx512_bf16``, ``amx_tile``,
        ``amx_bf16``, ``amx_int8``)."""
    @property
    def kernel_tier(self) -> str:
        """The SIMD tier the Rust kernels run: "avx512", "avx2" or "generic"."""
    def has(self, name: str) -> bool:
        """Whether feature ``name`` is present and allowed."""

def cpu_features() -> CpuFeatures:
    """The features (see `CpuFeatures`); ValueError naming ``FERROLLM_CPU_ISA`` if it holds an
    unknown cap."""

def _paged_attention(
    tensors: tuple[Any, Any, Any, Any, Any, Any],
    step: tuple[Any, Any, Any, Any, Any, Any],
    scale: float,
    sliding_window: int | None = None,
    parallel: bool = False,
) -> None:
    """Private to ``ferrollm.layers.paged_attention`` (call the ``ferrollm::paged_attention``
    torch op instead). ``tensors`` are the torch tensors ``(q, k, v, out, k_cache, v_cache)``
    and ``step`` is ``(slot_mapping, positions, cu_seqlens_q, context_lens, block_tables,
    rows)``; every dtype, device, shape and layout the kernel relies on is checked here, then
    K/V are written at ``slot_mapping`` and ``rows`` attended into ``out``. Slots, block ids,
    positions and row bounds are checked too (ValidationError naming the tensor)."""

@final
class _GgmlWeight:
    """Private to ``ferrollm.layers.ggml_linear`` (use its ``GgmlWeight``): a weight ``[N, K]``
    as segments of GGUF blocks stacked along the output rows. Each segment is ``(table,
    ggml_type)``, ``table`` a contiguous uint8 CPU tensor ``[rows, bytes per row of K values]``,
    checked here once and kept alive by this object. ValidationError naming the field for an
    unknown type, a table of the wrong shape or dtype, or ``k`` not whole blocks."""

    def __new__(
        cls,
        segments: Sequence[tuple[Any, int]],
        k: int,
        interleave: bool = True,
        in_place: Sequence[bool] | None = None,
    ) -> _GgmlWeight:
        """Checks each ``(table, ggml_type)`` for rows of ``k`` values and keeps the tables.
        With ``interleave``, a Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 segment of a multiple of 8 rows is
        copied once into runs of 8 interleaved rows (same size), which the kernels then read: one
        activation group meets 8 weight rows per instruction; the table's pages are paged out.
        A segment flagged in ``in_place`` (one flag per segment, or None) is interleaved in its
        own table instead, for a table nothing else reads: no copy. ValidationError naming
        ``in_place`` for a list of the wrong length."""
    @property
    def shape(self) -> tuple[int, int]:
        """``(N, K)``: output and input features."""
    @property
    def copy_bytes(self) -> int:
        """Bytes of interleaved copies held beside the segments' own tables."""
    @property
    def interleaved(self) -> list[bool]:
        """Per segment, whether the kernels read it interleaved (a copy, or in place)."""
    @property
    def in_place(self) -> list[bool]:
        """Per segment, whether its own table was interleaved in place (its rows are then in
        the kernels' layout, not the file's)."""
    def dequantize(self, out: Any) -> None:
        """The float weight ``[N, K]`` into ``out`` (contiguous float32 CPU), decoded from the
        blocks the kernels read (interleaved segments back in row order)."""
    def matmul(self, x: Any, path: str | None = None, parallel: bool = True) -> Any:
        """``x [M, K] @ W.T`` as a new ``[M, N]`` tensor of ``x``'s dtype: ``x`` is a float32 or
        bfloat16 CPU tensor (copied first if not contiguous). The activations are quantized to
        int8 groups of 32 once, then integer dot products run over each weight group. ``path``
        names a kernel path (`ggml_kernel_paths`; None: the best under ``FERROLLM_CPU_ISA``).
        ValidationError naming ``x`` or ``path`` otherwise."""

    def silu_mlp(
        self, x: Any, down: _GgmlWeight, path: str | None = None, parallel: bool = True
    ) -> Any:
        """Llama's gated feed-forward in one call: ``(silu(g) * u) @ down.T`` where ``[g | u] =
        x @ W.T`` are this weight's first and second halves of rows (gate, then up), as a new
        ``[M, down's N]`` tensor. ``x`` is a float32 CPU tensor ``[M, K]``; both products are
        `matmul`'s. ValidationError naming ``x``, ``down`` (whose K must be half of this
        weight's N) or ``path`` otherwise."""

def _ggml_dequantize_rows(table: Any, ggml_type: int, k: int, ids: Any, out: Any) -> None:
    """Private to ``ferrollm.layers.ggml_linear``: rows ``ids`` (int64 ``[T]``) of the block
    table ``table`` (contiguous uint8 ``[rows, bytes per row of k values]``) dequantized into
    ``out`` (contiguous float32 or bfloat16 ``[T, k]``), all CPU tensors. ValidationError naming
    the tensor for a wrong dtype or shape, or ``ids`` for an id outside the table."""

def _ggml_quantize(x: Any, ggml_type: int, out: Any) -> None:
    """Private to ``ferrollm.layers.ggml_linear``: contiguous float32 ``x [rows, k]`` rounded to
    nearest into blocks of ``ggml_type`` (Q4_1 = 3 or Q8_0 = 8) in ``out``, contiguous uint8
    ``[rows, bytes per row]``; ValidationError naming the tensor otherwise."""

def ggml_kernel_paths() -> list[str]:
    """The block-kernel paths this CPU runs under ``FERROLLM_CPU_ISA``'s cap, portable first:
    a subset of "generic", "avx2", "avx_vnni", "avx512_vnni" (the last is the one used)."""

def ggml_block_types() -> list[tuple[int, str, int, int]]:
    """``(ggml type id, name, values per block, bytes per block)`` of each type the block
    kernels read."""

def _use_openmp(library: str) -> bool:
    """Private to ``ferrollm.platforms.host.share_openmp_with_kernels``: from now on the
    kernels' parallel jobs run on the calling thread's OpenMP team, through ``GOMP_parallel``
    of the runtime at path ``library``, which must already be loaded (torch's libgomp); the
    symbol is looked up here. False if a runtime was set already or the library has no
    ``GOMP_parallel``; ValueError if it is not loaded."""

def kernel_threads() -> str:
    """Where the kernels' parallel jobs run: "openmp" (torch's team) or "rayon"."""
