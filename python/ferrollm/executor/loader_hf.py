"""Hugging Face model directories: config.json, safetensors weights, tokenizer files."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import safe_open
from tokenizers import Tokenizer

from ferrollm.distributed.shard_plan import WHOLE, ShardPlan
from ferrollm.executor.source import ModelSource, SpecialTokens
from ferrollm.models import media_text
from ferrollm.models.config import ModelConfig
from ferrollm.progress import counted

if TYPE_CHECKING:  # opening a directory (config, tokenizer) needs no torch: `ferrollm.preflight`
    import torch

    from ferrollm.layers.linear import Weight

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


class HFCheckpoint(ModelSource):
    """A Hugging Face directory; weights stream from one safetensors shard at a time."""

    def __init__(
        self,
        path: Path,
        weight_map: Mapping[str, str],
        stored_names: Mapping[str, str] | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(path, **fields)
        #: tensor name -> shard file name, in the order tensors are yielded.
        self.weight_map = dict(weight_map)
        #: tensor name -> the name the file stores it under, where they differ (the decoder
        #: of an image-text checkpoint: ``model.text_model.*``).
        self.stored_names = dict(stored_names or {})

    @classmethod
    def open(cls, directory: Path, dummy_weights: bool = False) -> HFCheckpoint:
        """Read config, generation config, tokenizer and the weight index of ``directory``;
        with ``dummy_weights`` (``load_format`` dummy) no weights are looked for or read."""
        raw = _read_json(directory / "config.json")
        family = media_text.media_family(raw)
        config = ModelConfig.from_hf_dict(
            raw if family is None else media_text.text_config(family, raw),
            _read_json(directory / "generation_config.json", missing_ok=True),
        )
        tokenizer_json = _read_tokenizer_json(directory)
        tokenizer_config = _read_json(directory / "tokenizer_config.json", missing_ok=True)
        weight_map = {} if dummy_weights else _weight_map(directory)
        stored_names: dict[str, str] = {}
        if family is not None:  # the decoder's tensors only, under the decoder's own names
            stored_names = media_text.stored_text_names(family, weight_map)
            weight_map = {name: weight_map[stored] for name, stored in stored_names.items()}
        return cls(
            directory,
            weight_map,
            stored_names,
            config=config,
            vision_family=family,
            tokenizer_json=tokenizer_json,
            chat_template=_chat_template(directory, tokenizer_config),
            special_tokens=_special_tokens(directory, tokenizer_json, tokenizer_config),
            dummy_weights=dummy_weights,
        )

    def iter_weights(
        self, dtype: torch.dtype, keep_quantized: bool = False, shard: ShardPlan = WHOLE
    ) -> Iterator[tuple[str, Weight]]:
        """See `ModelSource.iter_weights`; shards are opened one after another (safetensors
        checkpoints are dense, so ``keep_quantized`` changes nothing), and a sliced tensor is
        read through ``get_slice``, which reads only the slice's bytes."""
        names_by_shard: dict[str, list[str]] = {}
        for name, file_name in self.weight_map.items():
            names_by_shard.setdefault(file_name, []).append(name)
        with counted(len(self.weight_map), "Loading weights", "tensor") as tick:
            for file_name, names in names_by_shard.items():
                with safe_open(str(self.path / file_name), framework="pt") as f:
                    for name in names:
                        tick()
                        if not self._skipped(name):
                            tensor = _read(f, name, shard, self.stored_names.get(name, name))
                            self.num_bytes_read += tensor.nbytes
                            yield name, tensor.to(dtype)

    def _skipped(self, name: str) -> bool:
        # Rotary tables are recomputed; a tied head would be a second copy of the embeddings.
        if name.endswith("rotary_emb.inv_freq"):
            return True
        return self.config.tie_word_embeddings and name == "lm_head.weight"


def _read(file: Any, name: str, shard: ShardPlan, stored: str) -> torch.Tensor:
    """Tensor ``name`` (stored as ``stored``), this rank's slice of it."""
    part = shard.slice_of(name)
    if part is None:
        return file.get_tensor(stored)  # type: ignore[no-any-return]
    sliced = file.get_slice(stored)
    if part.dim == 0:
        return sliced[part.start : part.stop]  # type: ignore[no-any-return]
    return sliced[:, part.start : part.stop]  # type: ignore[no-any-return]


def _read_json(path: Path, missing_ok: bool = False) -> dict[str, Any]:
    if not path.is_file():
        if missing_ok:
            return {}
        raise FileNotFoundError(f"{path.name} is missing from {str(path.parent)!r}")
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object")
    return data


def _weight_map(directory: Path) -> dict[str, str]:
    if (directory / _INDEX).is_file():
        index = _read_json(directory / _INDEX)
        weight_map: dict[str, str] = index.get("weight_map", {})
        # Group by shard (in shard order) so each file is opened once.
        return dict(sorted(weight_map.items(), key=lambda item: item[1]))
    if (directory / _SINGLE).is_file():
        with safe_open(str(directory / _SINGLE), framework="pt") as f:
            return dict.fromkeys(f.keys(), _SINGLE)
    raise FileNotFoundError(
        f"no {_SINGLE} or {_INDEX} in {str(directory)!r}; only safetensors weights are supported"
    )


def _read_tokenizer_json(directory: Path) -> str:
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"tokenizer.json is missing from {str(directory)!r}; ferrollm needs a fast "
            f"(tokenizers) tokenizer saved with the model{_custom_tokenizer_hint(directory)}"
        )
    return path.read_text(encoding="utf-8")


def _custom_tokenizer_hint(directory: Path) -> str:
    """Why a directory has no tokenizer.json when its tokenizer is the repository's own code
    (ChatGLM3's SentencePiece ``tokenization_chatglm.py``, GLM-4's tiktoken one), which
    ferrollm never runs and transformers cannot convert without running it."""
    code = sorted(p.name for p in directory.glob("tokenization_*.py"))
    if not code:
        return ""
    return (
        f": its tokenizer is custom code ({', '.join(code)}) that ferrollm does not run; use "
        "the model's transformers-format release (for GLM-4: THUDM/glm-4-9b-chat-hf), or save "
        "a tokenizer.json converted from it beside the weights"
    )


def _chat_template(directory: Path, tokenizer_config: Mapping[str, Any]) -> str | None:
    # transformers >= 4.43 may save the template beside the config instead of inside it.
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if template is None:
        template = _read_json(directory / "chat_template.json", missing_ok=True).get(
            "chat_template"
        )
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _token_text(value: Any) -> str | None:
    # tokenizer_config writes a special token as a string or as an AddedToken dict.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _special_tokens(
    directory: Path, tokenizer_json: str, tokenizer_config: Mapping[str, Any]
) -> SpecialTokens:
    special_map = _read_json(directory / "special_tokens_map.json", missing_ok=True)
    tokenizer = Tokenizer.from_str(tokenizer_json)
    texts = {
        key: _token_text(tokenizer_config.get(key, special_map.get(key)))
        for key in ("bos_token", "eos_token", "pad_token", "unk_token")
    }
    ids = {key: None if t is None else tokenizer.token_to_id(t) for key, t in texts.items()}
    return SpecialTokens(
        bos_token=texts["bos_token"],
        eos_token=texts["eos_token"],
        pad_token=texts["pad_token"],
        unk_token=texts["unk_token"],
        bos_token_id=ids["bos_token"],
        eos_token_id=ids["eos_token"],
        pad_token_id=ids["pad_token"],
        add_bos_token=_adds_bos(tokenizer, ids["bos_token"]),
    )


def _adds_bos(tokenizer: Tokenizer, bos_token_id: int | None) -> bool:
    # The tokenizer.json post-processor is what actually runs, so ask it rather than trusting
    # tokenizer_config's add_bos_token flag.
    if bos_token_id is None:
        return False
    ids: list[int] = tokenizer.encode("a", add_special_tokens=True).ids
    return bool(ids) and ids[0] == bos_token_id
