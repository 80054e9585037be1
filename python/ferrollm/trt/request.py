"""`InferenceRequest`: the TensorRT-LLM-style request, a map from tensor name to tensor
(docs/api/trt.md#tensors-in, docs/api/trt.md#inferencerequest).

Each tensor may be given as a numpy array, a torch tensor, a (nested) list or a scalar. The
request keeps what it was given; ``to_tensor_map()`` validates it (the Rust
``validate("trt", ...)``, the one validation path, whose errors name the tensor) and returns
every tensor in its documented shape and dtype: ``request_output_len`` ``[1, 1]``,
``input_ids`` ``[1, N]``, the scalars ``[1]`` (docs/decisions.md#tensor-shapes), word lists
``[2, L]`` (or ``[batch, 2, L]``), ``embedding_bias`` ``[1, vocab]``, ``prompt_embedding_table``
``[rows, hidden]`` (float16 stays float16, other floats become float32: a row can then equal
a float32 embedding exactly). The pybind names ``max_new_tokens``, ``length_penalty`` and
``is_streaming`` are accepted as keyword aliases (docs/decisions.md#pybind-names).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from ferrollm._core import Limits, ValidRequest, validate

#: Documented dtype of each tensor, and whether it is a one-value tensor (``[1]``).
SCALARS: dict[str, type[np.generic]] = {
    "streaming": np.bool_,
    "beam_width": np.int32,
    "temperature": np.float32,
    "runtime_top_k": np.int32,
    "runtime_top_p": np.float32,
    "len_penalty": np.float32,
    "early_stopping": np.int32,
    "repetition_penalty": np.float32,
    "min_length": np.int32,
    "presence_penalty": np.float32,
    "frequency_penalty": np.float32,
    "no_repeat_ngram_size": np.int32,
    "random_seed": np.uint64,
    "end_id": np.int32,
    "pad_id": np.int32,
    "prompt_vocab_size": np.int32,
    "lora_task_id": np.uint64,
    "return_log_probs": np.bool_,
    "return_context_logits": np.bool_,
    "return_generation_logits": np.bool_,
}
#: Tensors of more than one value: dtype and the rank they are brought to (a missing leading
#: 1 is added; ``None``: the rank is kept).
ARRAYS: dict[str, tuple[type[np.generic], int | None]] = {
    "input_ids": (np.int32, 2),
    "request_output_len": (np.int32, 2),
    "embedding_bias": (np.float32, 2),
    "bad_words_list": (np.int32, None),
    "stop_words_list": (np.int32, None),
    "prompt_embedding_table": (np.float32, 2),
    "lora_weights": (np.float32, 2),
    "lora_config": (np.int32, 2),
    "draft_input_ids": (np.int32, 1),
    "draft_logits": (np.float32, 2),
}
#: String tensors of one value (the TensorRT-LLM backend's guided decoding: the guide's type,
#: "json", "json_schema", "regex" or "lark", and the guide itself).
STRINGS = ("guided_decoding_guide_type", "guided_decoding_guide")
#: The pybind class's names for three tensors (docs/decisions.md#pybind-names).
ALIASES = {
    "max_new_tokens": "request_output_len",
    "length_penalty": "len_penalty",
    "is_streaming": "streaming",
}
#: Limits for checking a request on its own (no model): only the vocabulary-free rules act.
_NO_MODEL = Limits(max_model_len=1 << 30, max_input_tokens=(1 << 30) - 1, max_iter_times=1 << 30)


@dataclass(init=False, eq=False)
class InferenceRequest:
    """One request: ``input_ids`` and ``request_output_len`` are mandatory, every other
    tensor optional (None = absent, TRT's default). ``request_id`` (uint64) is chosen by the
    `Executor` when None."""

    input_ids: Any
    request_output_len: Any
    request_id: int | None = None
    streaming: Any = None
    beam_width: Any = None
    temperature: Any = None
    runtime_top_k: Any = None
    runtime_top_p: Any = None
    len_penalty: Any = None
    early_stopping: Any = None
    repetition_penalty: Any = None
    min_length: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    no_repeat_ngram_size: Any = None
    random_seed: Any = None
    end_id: Any = None
    pad_id: Any = None
    embedding_bias: Any = None
    bad_words_list: Any = None
    stop_words_list: Any = None
    prompt_embedding_table: Any = None
    prompt_vocab_size: Any = None
    lora_task_id: Any = None
    lora_weights: Any = None
    lora_config: Any = None
    return_log_probs: Any = None
    return_context_logits: Any = None
    return_generation_logits: Any = None
    draft_input_ids: Any = None
    draft_logits: Any = None
    guided_decoding_guide_type: Any = None
    guided_decoding_guide: Any = None

    def __init__(
        self,
        input_ids: Any = None,
        request_output_len: Any = None,
        *,
        request_id: int | None = None,
        **tensors: Any,
    ) -> None:
        for f in fields(self):
            setattr(self, f.name, None)
        self.input_ids, self.request_output_len = input_ids, request_output_len
        self.request_id = request_id
        for name, value in tensors.items():
            canonical = ALIASES.get(name, name)
            if canonical not in SCALARS and canonical not in ARRAYS and canonical not in STRINGS:
                raise TypeError(f"InferenceRequest has no tensor named {name!r}")
            if value is not None and getattr(self, canonical) is not None:
                raise TypeError(f"`{name}` is an alias of `{canonical}`; give only one of them")
            setattr(self, canonical, value)

    @classmethod
    def from_tensor_map(
        cls, tensors: Mapping[str, Any], request_id: int | None = None
    ) -> InferenceRequest:
        """A request from a name -> tensor map (``to_tensor_map()``'s form, or TRT's)."""
        return cls(request_id=request_id, **tensors)

    def raw_tensors(self) -> dict[str, Any]:
        """The given tensors (None dropped), torch tensors as numpy arrays, as given
        otherwise."""
        out = {}
        for name in (*ARRAYS, *SCALARS):
            value = getattr(self, name)
            if value is not None:
                out[name] = _host(value)
        for name in STRINGS:
            value = getattr(self, name)
            if value is not None:
                out[name] = _string(value)
        return out

    def validate(self, limits: Limits | None = None) -> ValidRequest:
        """Check every tensor (the Rust ``validate("trt", ...)``); against ``limits`` (the
        model's vocabulary, lengths and beam width) when given. Raises ValidationError whose
        ``param`` names the tensor."""
        return validate("trt", self.raw_tensors(), limits or _NO_MODEL)

    def to_tensor_map(self, limits: Limits | None = None) -> dict[str, npt.NDArray[Any]]:
        """Every given tensor, validated, in its documented shape and dtype."""
        return self.checked(limits)[1]

    def checked(
        self, limits: Limits | None = None
    ) -> tuple[ValidRequest, dict[str, npt.NDArray[Any]]]:
        """``validate(limits)`` and ``to_tensor_map()`` from one validation."""
        raw = self.raw_tensors()
        valid = validate("trt", raw, limits or _NO_MODEL)
        return valid, {name: normalise(name, value) for name, value in raw.items()}


def normalise(name: str, value: Any) -> npt.NDArray[Any]:
    """A validated tensor in its documented shape and dtype."""
    if name in STRINGS:
        return np.asarray([value], dtype=np.str_)
    if name in SCALARS:
        return np.asarray(value, dtype=SCALARS[name]).reshape(1)
    dtype, rank = ARRAYS[name]
    array = np.asarray(value)
    if name == "prompt_embedding_table" and array.dtype == np.float16:
        dtype = np.float16
    array = array.astype(dtype)
    if name == "request_output_len":
        return array.reshape(1, 1)
    while rank is not None and array.ndim < rank:
        array = array[None]
    return array


def _host(value: Any) -> Any:
    """A torch tensor as a host numpy array (float32 for dtypes numpy lacks); else as is."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            tensor = tensor.float()
        return tensor.numpy()
    return value


def _string(value: Any) -> Any:
    """A string tensor's value as a str (a ``[1]`` array or list unwrapped, bytes decoded);
    anything else as is, for the validator to name."""
    while isinstance(value, (list, tuple, np.ndarray)) and len(value) == 1:
        value = value[0]
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, np.str_):
        return str(value)
    return value
