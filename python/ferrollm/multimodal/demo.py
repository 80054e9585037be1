"""A SmolVLM-shaped demo checkpoint assembled from the default model, with nothing fetched.

``ferrollm make-smolvlm-demo OUT_DIR`` writes an ``Idefics3ForConditionalGeneration``
directory whose text decoder is the real SmolLM2-135M-Instruct (the default GGUF, dequantized
to float32 under Idefics3's ``model.text_model.*`` names, the head tied to the embedding as
SmolLM2's is) and whose vision tower and connector are random but fixed by ``--seed``. Text
stays coherent (the decoder is a real chat model) while every image step can be checked against
transformers, which loads the directory as it is (``AutoProcessor`` /
``Idefics3ForConditionalGeneration.from_pretrained``): the directory is the oracle's input too.

Why these sizes: the vision side is SmolVLM-256M's shape (SigLIP patches of 16, a pixel shuffle
of 4, so a tile is 16 x 16 patches -> 16 ``<image>`` tokens, tiles cut from an image resized to
a longest edge of twice the tile) scaled down so an image costs milliseconds on a CPU: 256-pixel
tiles instead of 512, a 192-wide, 2-layer tower instead of 768 x 12. An image is at most a 2 x 2
grid plus the global tile: 80 ``<image>`` tokens.

The tokenizer is SmolLM2's plus SmolVLM's added tokens (``<fake_token_around_image>``,
``<image>``, ``<end_of_utterance>``, ``<global-img>``, ``<row_r_col_c>``), appended after
SmolLM2's 49,152 ids, so every text token keeps its id and its embedding row; the added rows are
random, scaled below the real rows' spread so they rarely outscore a real token. The chat
template is SmolLM2's ChatML (what the decoder was trained on) written to walk typed content
parts as SmolVLM's does, an image part printing ``<image>``.

Deterministic: the same seed and GGUF give the same bytes. Only torch, safetensors and the
GGUF reader are used (transformers is the tests' oracle, not a dependency).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The vision tower: SmolVLM-256M's shape (patch 16, pixel shuffle 4), scaled down for CPUs.
VISION_CONFIG: dict[str, Any] = {
    "model_type": "idefics3_vision",
    "hidden_size": 192,
    "intermediate_size": 768,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "num_channels": 3,
    "image_size": 256,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
}
SCALE_FACTOR = 4
#: ``<image>`` tokens per tile: (256 / 16 / 4) ** 2.
IMAGE_SEQ_LEN = (VISION_CONFIG["image_size"] // VISION_CONFIG["patch_size"] // SCALE_FACTOR) ** 2
#: Images are resized to this longest edge, then cut into ``image_size`` tiles.
LONGEST_EDGE = 2 * VISION_CONFIG["image_size"]
#: SmolVLM's added tokens, in id order after the text vocabulary.
ADDED_TOKENS = [
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
]
#: The added tokens' embedding rows: this fraction of the text rows' standard deviation.
ADDED_ROW_SCALE = 0.5
#: ChatML, walking typed parts (a string content is printed as it is); SmolLM2's default
#: system prompt as its own template adds one.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
#: The file whose presence says a build finished (written last).
DONE_MARKER = "model.safetensors"


def build_smolvlm_demo(out_dir: Path, seed: int = 0, gguf_path: Path | None = None) -> Path:
    """Write the demo checkpoint to ``out_dir`` (created; existing files are overwritten)
    from ``gguf_path`` (default: the default model's GGUF) and return ``out_dir``."""
    import torch
    from safetensors.torch import save_file

    from ferrollm.default_model import default_model_path
    from ferrollm.executor.gguf_config import hf_config_from_gguf
    from ferrollm.executor.gguf_reader import GGUFFile
    from ferrollm.executor.loader_gguf import GGUFCheckpoint

    path = gguf_path or default_model_path()
    source = GGUFCheckpoint.open(path)
    file = GGUFFile(path)  # its metadata as transformers' config (memory-mapped, cheap)
    text_config = hf_config_from_gguf(file.metadata, [t.name for t in file.tensors], None)
    if text_config.get("model_type") != "llama" or not text_config.get("tie_word_embeddings"):
        raise ValueError(f"{source.path}: expected a Llama GGUF with tied embeddings")
    text_vocab = int(text_config["vocab_size"])
    tensors: dict[str, torch.Tensor] = {}
    for name, weight in source.iter_weights(torch.float32):
        assert isinstance(weight, torch.Tensor)
        tensors[name.replace("model.", "model.text_model.", 1)] = weight.contiguous()
    generator = torch.Generator().manual_seed(seed)
    embed = tensors["model.text_model.embed_tokens.weight"]
    rows = torch.randn(len(ADDED_TOKENS), embed.shape[1], generator=generator)
    added = rows * (ADDED_ROW_SCALE * float(embed.std()))
    tensors["model.text_model.embed_tokens.weight"] = torch.cat([embed, added]).contiguous()
    tensors.update(_vision_weights(generator, int(text_config["hidden_size"]), float(embed.std())))

    vocab_size = text_vocab + len(ADDED_TOKENS)
    image_token_id = text_vocab + ADDED_TOKENS.index("<image>")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / DONE_MARKER).unlink(missing_ok=True)
    _write_json(
        out_dir / "config.json",
        _model_config(text_config, vocab_size, image_token_id, source.special_tokens),
    )
    _write_json(out_dir / "generation_config.json", _generation_config(source.special_tokens))
    _write_json(out_dir / "tokenizer.json", _tokenizer_json(source.tokenizer_json, text_vocab))
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(source.special_tokens))
    _write_json(out_dir / "processor_config.json", _processor_config())
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    partial = out_dir / f"{DONE_MARKER}.partial"  # renamed when whole: a killed build shows
    save_file(dict(sorted(tensors.items())), partial, metadata={"format": "pt"})
    partial.replace(out_dir / DONE_MARKER)
    return out_dir


def _vision_weights(generator: Any, text_hidden: int, embed_std: float) -> dict[str, Any]:
    """Seeded random SigLIP tower and connector, at transformers' initial scales (normal
    0.02 matrices, LayerNorms around 1 with small biases, so a misread one shows); the
    connector is scaled so image features have the text embeddings' spread."""
    import torch

    hidden = VISION_CONFIG["hidden_size"]
    inner = VISION_CONFIG["intermediate_size"]
    patch = VISION_CONFIG["patch_size"]
    positions = (VISION_CONFIG["image_size"] // patch) ** 2
    shuffled = hidden * SCALE_FACTOR**2
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.patch_embedding.weight": (hidden, 3, patch, patch),
        "embeddings.patch_embedding.bias": (hidden,),
        "embeddings.position_embedding.weight": (positions, hidden),
        "post_layernorm.weight": (hidden,),
        "post_layernorm.bias": (hidden,),
    }
    for i in range(VISION_CONFIG["num_hidden_layers"]):
        layer = f"encoder.layers.{i}."
        for norm in ("layer_norm1", "layer_norm2"):
            shapes[f"{layer}{norm}.weight"] = (hidden,)
            shapes[f"{layer}{norm}.bias"] = (hidden,)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[f"{layer}self_attn.{proj}.weight"] = (hidden, hidden)
            shapes[f"{layer}self_attn.{proj}.bias"] = (hidden,)
        shapes[f"{layer}mlp.fc1.weight"] = (inner, hidden)
        shapes[f"{layer}mlp.fc1.bias"] = (inner,)
        shapes[f"{layer}mlp.fc2.weight"] = (hidden, inner)
        shapes[f"{layer}mlp.fc2.bias"] = (hidden,)
    out: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        if "norm" in name:
            value = (1.0 if name.endswith("weight") else 0.0) + 0.1 * noise
        elif "position_embedding" in name:
            value = noise  # SigLIP's positions: as large as the patches' embeddings
        else:
            value = 0.02 * noise if name.endswith("weight") else 0.01 * noise
        out[f"model.vision_model.{name}"] = value
    # The shuffled features are LayerNorm outputs (about unit spread): rows of this scale give
    # features with about the embeddings' spread.
    projection = torch.randn(text_hidden, shuffled, generator=generator)
    out["model.connector.modality_projection.proj.weight"] = projection * (
        embed_std / shuffled**0.5
    )
    return {name: tensor.contiguous() for name, tensor in out.items()}


def _model_config(
    text: dict[str, Any], vocab_size: int, image_token_id: int, special: Any
) -> dict[str, Any]:
    text_config = {k: v for k, v in text.items() if k not in ("architectures", "dtype")}
    rope_theta = text_config.pop("rope_theta", None)
    text_config.pop("rope_scaling", None)
    if rope_theta is not None:
        text_config["rope_parameters"] = {"rope_theta": rope_theta, "rope_type": "default"}
    eos = text_config.get("eos_token_id")
    if isinstance(eos, list) and len(eos) == 1:
        text_config["eos_token_id"] = eos[0]
    text_config.update(vocab_size=vocab_size, hidden_act="silu", tie_word_embeddings=True)
    return {
        "architectures": ["Idefics3ForConditionalGeneration"],
        "model_type": "idefics3",
        "dtype": "float32",
        "image_token_id": image_token_id,
        "scale_factor": SCALE_FACTOR,
        "pad_token_id": special.pad_token_id,
        "tie_word_embeddings": True,
        "use_cache": True,
        "text_config": text_config,
        "vision_config": VISION_CONFIG,
    }


def _generation_config(special: Any) -> dict[str, Any]:
    return {
        "bos_token_id": special.bos_token_id,
        "eos_token_id": special.eos_token_id,
        "pad_token_id": special.pad_token_id,
    }


def _tokenizer_json(text_tokenizer: str, text_vocab: int) -> dict[str, Any]:
    """SmolLM2's tokenizer.json with `ADDED_TOKENS` appended as special added tokens."""
    tokenizer: dict[str, Any] = json.loads(text_tokenizer)
    vocab = tokenizer["model"]["vocab"]
    if len(vocab) != text_vocab or any(t in vocab for t in ADDED_TOKENS):
        raise ValueError("the GGUF's vocabulary is not the expected SmolLM2 one")
    for i, token in enumerate(ADDED_TOKENS):
        vocab[token] = text_vocab + i
        tokenizer["added_tokens"].append(
            {
                "id": text_vocab + i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    return tokenizer


def _tokenizer_config(special: Any) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "processor_class": "Idefics3Processor",
        "bos_token": special.bos_token,
        "eos_token": special.eos_token,
        "pad_token": special.pad_token,
        "unk_token": special.unk_token,
        "add_bos_token": False,
        "extra_special_tokens": ADDED_TOKENS[:4],
        "model_max_length": 8192,
    }


def _processor_config() -> dict[str, Any]:
    return {
        "processor_class": "Idefics3Processor",
        "image_seq_len": IMAGE_SEQ_LEN,
        "image_processor": {
            "image_processor_type": "Idefics3ImageProcessor",
            "do_convert_rgb": True,
            "do_resize": True,
            "size": {"longest_edge": LONGEST_EDGE},
            "resample": 1,
            "do_image_splitting": True,
            "max_image_size": {"longest_edge": VISION_CONFIG["image_size"]},
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "do_pad": True,
        },
    }


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def is_built(directory: Path) -> bool:
    """Whether ``directory`` holds a finished build (its weights file, written last)."""
    return (directory / DONE_MARKER).is_file() and (directory / "config.json").is_file()
