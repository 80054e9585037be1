"""Tiny random-weight Hugging Face models, one per supported family, built on the fly.

Shared by ``tests/engine`` and ``tests/server`` (``tests/`` is on ``sys.path`` through the
root ``conftest.py``): ``build_tiny_model(family, directory)`` saves a seeded model, and
``tiny_gguf.write_tiny_gguf`` converts one to GGUF.

Each directory holds config.json, generation_config.json, safetensors weights, and a small
byte-level BPE tokenizer (tokenizer.json, tokenizer_config.json, a ChatML chat template), so the
model can be driven from text as well as from token ids. Weights are random but seeded, with
norms and biases randomized too (transformers' init leaves them at 1 and 0, which would hide a
misnamed or unloaded tensor) and large enough that greedy decoding is not a sequence of ties.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

#: Sizes shared by every tiny model; vocab covers the tokenizer below (300 tokens).
TINY_SIZES: dict[str, Any] = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

#: family -> (transformers config class name, overrides of TINY_SIZES).
TINY_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    # Llama 3.1-style rope scaling; original context short enough that it bends real positions.
    "llama3": (
        "LlamaConfig",
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "mistral": ("MistralConfig", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", {}),  # q/k/v bias, no o_proj bias
    "qwen3": ("Qwen3Config", {"head_dim": 32}),  # q/k norm; head_dim != hidden / heads
    "tied": ("LlamaConfig", {"tie_word_embeddings": True}),  # SmolLM2-like
    # Llama's optional biases: q/k/v/o (attention_bias) and gate/up/down (mlp_bias).
    "llama-bias": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),
    # Fused qkv_proj / gate_up_proj tensors; long rope over 12 of each head's 16 dims, its
    # original context short enough that a whole-context engine runs the long factors.
    "phi3": (
        "Phi3Config",
        {
            "partial_rotary_factor": 0.75,
            "original_max_position_embeddings": 64,
            "rope_scaling": {
                "rope_type": "longrope",
                "short_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0],
                "long_factor": [1.0, 2.0, 4.0, 8.0, 12.0, 16.0],
            },
        },
    ),
}

#: Latent attention (a 32-wide latent and 8 rotated features a token), 8 experts in 4 groups,
#: top-2 from the best 2 groups, one shared expert, layer 0 dense.
DEEPSEEK_SIZES: dict[str, Any] = {
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_intermediate_size": 32,
}
#: DeepSeek-V2's YaRN: equal mscales (so the cos/sin factor is 1, as llama.cpp assumes; the
#: softmax scale still moves), an original context inside the tiny one.
DEEPSEEK_YARN: dict[str, Any] = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 32,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "beta_fast": 32,
    "beta_slow": 1,
}

#: Families ``build_tiny_model`` also builds, outside the per-family sweeps of `TINY_FAMILIES`
#: (so the engine tests run once per family there do not multiply; tensor parallelism tests
#: these). Mixture of experts: Mixtral, and Qwen2-MoE with a shared expert, layer 0 dense (every
#: second layer sparse), split features of 64 and 96. GLM: half of each head rotated in
#: interleaved pairs, gate/up saved fused; Glm4 adds post-block norms; "chatglm" is the GLM
#: model saved as ChatGLM3's original checkpoint (`to_chatglm`), which transformers cannot read.
MORE_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2-moe": (
        "Qwen2MoeConfig",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 96,
            "decoder_sparse_step": 2,
        },
    ),
    # Gemma 2: offset norms around both blocks, every other layer sliding, capped scores;
    # the query scalar is head_dim, as llama.cpp assumes (GGUF has no key for it).
    "gemma2": (
        "Gemma2Config",
        {
            "head_dim": 16,
            "sliding_window": 4,
            "query_pre_attn_scalar": 16,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
        },
    ),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    ),
    "glm": ("GlmConfig", {"head_dim": 16}),
    "glm4": ("Glm4Config", {"head_dim": 16}),
    "chatglm": ("GlmConfig", {"head_dim": 16, "rope_theta": 50000.0}),
    # DeepSeek (`DEEPSEEK_SIZES`): V2 with a plain q_proj, softmax scores, group-limited
    # routing, scaled weights and YaRN; V3 with the q bottleneck, sigmoid scores, the
    # correction bias (randomized) and renormalised weights.
    "deepseek-v2": (
        "DeepseekV2Config",
        {
            **DEEPSEEK_SIZES,
            "q_lora_rank": None,
            "topk_method": "group_limited_greedy",
            "routed_scaling_factor": 1.5,
            "rope_parameters": DEEPSEEK_YARN,
        },
    ),
    "deepseek-v3": (
        "DeepseekV3Config",
        {**DEEPSEEK_SIZES, "q_lora_rank": 32, "norm_topk_prob": True, "routed_scaling_factor": 2.0},
    ),
}

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_TOKENIZER_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "What is the capital of France? Paris is the capital of France.",
    "Hello world! hello, world: 0123456789 def f(x): return x * 2",
]


def build_tiny_tokenizer(directory: Path) -> None:
    """Train a 300-token byte-level BPE on a fixed corpus and save it with a ChatML template.

    Ids 0-2 are ``<|endoftext|>``, ``<|im_start|>`` (bos) and ``<|im_end|>`` (eos).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_TOKENIZER_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(directory)


def build_tiny_model(
    family: str,
    directory: Path,
    *,
    max_shard_size: str | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    sizes: dict[str, Any] | None = None,
) -> Path:
    """Save a seeded random ``family`` model (and the tiny tokenizer) to ``directory``;
    ``sizes`` overrides `TINY_SIZES` and the family's own (head counts that divide by 3, say)."""
    import transformers

    class_name, overrides = {**TINY_FAMILIES, **MORE_FAMILIES}[family]
    config = getattr(transformers, class_name)(**{**TINY_SIZES, **overrides, **(sizes or {})})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    _randomize(model, seed)
    model.to(dtype)
    shard = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, **shard)
    if family == "chatglm":
        _resave_as_chatglm(directory)
    build_tiny_tokenizer(directory)
    return directory


#: The vision side of the tiny Idefics3 (SmolVLM-shaped) model: 64-pixel tiles of 8 x 8 patches,
#: so an 8 x 8 grid whose position buckets a smaller tile exercises; 2 layers of 4 heads.
IDEFICS3_VISION_SIZES: dict[str, Any] = {
    "image_size": 64,
    "patch_size": 8,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
#: Pixel shuffle of 2: a full tile is 8 x 8 patches -> 16 ``<image>`` tokens.
IDEFICS3_SCALE_FACTOR = 2
#: Tokens the tiny Idefics3 tokenizer adds past the BPE's 300, in id order (300 ...): the
#: processor's markers and the tile tags of grids up to 4 x 4, filling the vocabulary to 320.
IDEFICS3_ADDED_TOKENS = [
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5)),
]
#: The ``<image>`` token's id, inside the tiny vocabulary.
IDEFICS3_IMAGE_TOKEN_ID = 301
#: The processor's sizes: images resized to a longest edge of 128, cut into 64-pixel tiles
#: (so up to a 2 x 2 grid plus the global tile).
IDEFICS3_PROCESSOR_SIZES: dict[str, Any] = {
    "size": {"longest_edge": 128},
    "max_image_size": {"longest_edge": 64},
}


def build_tiny_idefics3(directory: Path, seed: int = 0) -> Path:
    """Save a seeded random ``Idefics3ForConditionalGeneration`` (SmolVLM's shape: SigLIP
    encoder, pixel-shuffle connector, tiny Llama text model of `TINY_SIZES`) to ``directory``,
    with its processor (`build_tiny_idefics3_processor`).

    Every weight is randomized as `build_tiny_model`'s are (LayerNorm weights and biases
    around 1), so an unloaded or misplaced vision tensor changes the image features.
    """
    import transformers

    config = transformers.Idefics3Config(
        vision_config=IDEFICS3_VISION_SIZES,
        text_config={"model_type": "llama", **TINY_SIZES},
        scale_factor=IDEFICS3_SCALE_FACTOR,
        image_token_id=IDEFICS3_IMAGE_TOKEN_ID,
    )
    torch.manual_seed(seed)
    model = transformers.Idefics3ForConditionalGeneration(config)
    _randomize(model, seed)
    model.save_pretrained(directory)
    build_tiny_idefics3_processor(directory)
    return directory


def build_tiny_idefics3_processor(directory: Path) -> Any:
    """Save (and return) an ``Idefics3Processor`` to ``directory``: the tiny tokenizer plus
    `IDEFICS3_ADDED_TOKENS`, transformers' Pillow image processor at `IDEFICS3_PROCESSOR_SIZES`,
    16 ``<image>`` tokens per tile (the tiny model's)."""
    from transformers import Idefics3Processor, PreTrainedTokenizerFast
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    build_tiny_tokenizer(directory)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    tokenizer.add_special_tokens({"additional_special_tokens": IDEFICS3_ADDED_TOKENS})
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(**IDEFICS3_PROCESSOR_SIZES),
        tokenizer=tokenizer,
        image_seq_len=16,
    )
    processor.save_pretrained(directory)
    return processor


#: The tiny Qwen2-Audio's encoder: Whisper's 30 s window (1,500 positions, so transformers
#: takes the features), 80 mel channels (Qwen2-Audio has 128: the count must come from the
#: config), two layers.
QWEN2_AUDIO_ENCODER_SIZES: dict[str, Any] = {
    "model_type": "qwen2_audio_encoder",
    "d_model": 32,
    "encoder_layers": 2,
    "encoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
}
#: The audio tokens the tiny tokenizer gains (ids 300, 301, 302).
QWEN2_AUDIO_ADDED_TOKENS = ["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]
#: Qwen2-Audio-Instruct's chat template: it walks content parts and writes each audio part as
#: ``Audio n: <|audio_bos|><|AUDIO|><|audio_eos|>``.
QWEN2_AUDIO_CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}"
    "<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_qwen2_audio(directory: Path, seed: int = 0) -> Path:
    """Save a seeded random ``Qwen2AudioForConditionalGeneration`` (Whisper-style encoder of
    `QWEN2_AUDIO_ENCODER_SIZES`, projector, tiny Qwen2 of `TINY_SIZES`) to ``directory``,
    with its processor (`build_tiny_qwen2_audio_processor`). Every weight is randomized as
    `build_tiny_model`'s are, the learned positions and LayerNorms included."""
    import transformers

    processor = build_tiny_qwen2_audio_processor(directory)
    config = transformers.Qwen2AudioConfig(
        audio_config=QWEN2_AUDIO_ENCODER_SIZES,
        text_config={"model_type": "qwen2", **TINY_SIZES},
        audio_token_index=processor.audio_token_id,
    )
    torch.manual_seed(seed)
    model = transformers.Qwen2AudioForConditionalGeneration(config)
    _randomize(model, seed)
    model.save_pretrained(directory)
    return directory


def build_tiny_qwen2_audio_processor(directory: Path) -> Any:
    """Save (and return) a ``Qwen2AudioProcessor`` to ``directory``: the tiny tokenizer plus
    `QWEN2_AUDIO_ADDED_TOKENS` and Qwen2-Audio's chat template, and transformers' Whisper
    feature extractor with 80 mel channels."""
    from transformers import PreTrainedTokenizerFast, Qwen2AudioProcessor, WhisperFeatureExtractor

    build_tiny_tokenizer(directory)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN2_AUDIO_ADDED_TOKENS})
    tokenizer.chat_template = QWEN2_AUDIO_CHAT_TEMPLATE
    processor = Qwen2AudioProcessor(
        feature_extractor=WhisperFeatureExtractor(feature_size=80),
        tokenizer=tokenizer,
        chat_template=QWEN2_AUDIO_CHAT_TEMPLATE,
    )
    processor.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return processor


#: Qwen2-VL's special tokens, added after the tiny tokenizer's 300 (ids 300-303).
QWEN2VL_ADDED_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
#: The tiny Qwen2-VL vision tower: 14-pixel patches, 2x2 merge, 2 frames a temporal patch.
QWEN2VL_VISION_SIZES: dict[str, Any] = {
    "depth": 2,
    "embed_dim": 32,
    "num_heads": 2,
    "mlp_ratio": 2,
    "hidden_size": TINY_SIZES["hidden_size"],
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}
#: Small pixel budgets, so images stay a few dozen tokens: 4 to 64 merged tokens.
QWEN2VL_PIXELS = {"min_pixels": 4 * 28 * 28, "max_pixels": 64 * 28 * 28}


def build_tiny_qwen2_vl(directory: Path, seed: int = 0) -> Path:
    """Save a seeded random ``Qwen2VLForConditionalGeneration`` (tiny Qwen2 text model of
    `TINY_SIZES`, M-RoPE sections 2/3/3 of its 16-dim heads; `QWEN2VL_VISION_SIZES` tower) to
    ``directory``, with its processor (`build_tiny_qwen2_vl_processor`); weights randomized as
    `build_tiny_model`'s are."""
    import transformers

    return _build_tiny_qwen_vl(
        directory,
        seed,
        transformers.Qwen2VLConfig(vision_config=QWEN2VL_VISION_SIZES, **_qwen_vl_text_fields()),
        transformers.Qwen2VLForConditionalGeneration,
    )


#: The tiny Qwen2.5-VL vision tower: as Qwen2-VL's, with windows of 2x2 merged tokens (56
#: pixels) in block 0 and full attention in block 1.
QWEN2_5_VL_VISION_SIZES: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 2,
    "out_hidden_size": TINY_SIZES["hidden_size"],
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 56,
    "fullatt_block_indexes": [1],
    "tokens_per_second": 2,
}


def build_tiny_qwen2_5_vl(directory: Path, seed: int = 0) -> Path:
    """Save a seeded random ``Qwen2_5_VLForConditionalGeneration`` (the text model of
    `build_tiny_qwen2_vl`, the `QWEN2_5_VL_VISION_SIZES` tower) to ``directory``, with the same
    processor files as `build_tiny_qwen2_vl` (Qwen2.5-VL uses Qwen2-VL's image processor)."""
    import transformers

    config = transformers.Qwen2_5_VLConfig(
        vision_config=QWEN2_5_VL_VISION_SIZES, **_qwen_vl_text_fields()
    )
    return _build_tiny_qwen_vl(
        directory, seed, config, transformers.Qwen2_5_VLForConditionalGeneration
    )


def _qwen_vl_text_fields() -> dict[str, Any]:
    """The tiny Qwen-VL config's text model and media token ids (`QWEN2VL_ADDED_TOKENS`)."""
    tokens = {t: 300 + i for i, t in enumerate(QWEN2VL_ADDED_TOKENS)}
    return {
        "text_config": {
            **TINY_SIZES,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
            },
        },
        "vision_start_token_id": tokens["<|vision_start|>"],
        "vision_end_token_id": tokens["<|vision_end|>"],
        "image_token_id": tokens["<|image_pad|>"],
        "video_token_id": tokens["<|video_pad|>"],
    }


def _build_tiny_qwen_vl(directory: Path, seed: int, config: Any, model_class: Any) -> Path:
    torch.manual_seed(seed)
    model = model_class(config)
    _randomize(model, seed)
    model.save_pretrained(directory)
    build_tiny_qwen2_vl_processor(directory)
    return directory


def build_tiny_qwen2_vl_processor(directory: Path) -> Any:
    """Save (and return) the parts of a ``Qwen2VLProcessor`` to ``directory``: the tiny
    tokenizer plus `QWEN2VL_ADDED_TOKENS`, and transformers' Pillow image processor at
    `QWEN2VL_PIXELS` (``preprocessor_config.json``, which transformers' video processor and
    ours read too, the checkpoint having no video config). Returns the image processor."""
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    build_tiny_tokenizer(directory)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN2VL_ADDED_TOKENS})
    tokenizer.save_pretrained(directory)
    size = {
        "shortest_edge": QWEN2VL_PIXELS["min_pixels"],
        "longest_edge": QWEN2VL_PIXELS["max_pixels"],
    }
    image_processor = Qwen2VLImageProcessorPil(size=size)
    image_processor.save_pretrained(directory)
    return image_processor


#: transformers' GLM tensor names -> ChatGLM3's, as the original checkpoints name them.
CHATGLM_NAMES = {
    "model.embed_tokens.": "transformer.embedding.word_embeddings.",
    "model.norm.": "transformer.encoder.final_layernorm.",
    "lm_head.": "transformer.output_layer.",
    "model.layers.": "transformer.encoder.layers.",
    ".self_attn.o_proj.": ".self_attention.dense.",
    ".mlp.gate_up_proj.": ".mlp.dense_h_to_4h.",
    ".mlp.down_proj.": ".mlp.dense_4h_to_h.",
}


def chatglm_name(name: str) -> str:
    """ChatGLM3's name for transformers GLM tensor ``name`` (q/k/v: the fused tensor's)."""
    for hf_key, theirs in CHATGLM_NAMES.items():
        name = name.replace(hf_key, theirs)
    for projection in (".self_attn.q_proj.", ".self_attn.k_proj.", ".self_attn.v_proj."):
        name = name.replace(projection, ".self_attention.query_key_value.")
    return name


def to_chatglm(
    config: dict[str, Any], state: dict[str, torch.Tensor]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A transformers GLM config dict and state dict as ChatGLM3's config.json and tensors
    (q/k/v fused): the inverse of transformers' conversion of the original checkpoints."""
    chatglm = {
        "architectures": ["ChatGLMModel"],
        "model_type": "chatglm",
        "padded_vocab_size": config["vocab_size"],
        "hidden_size": config["hidden_size"],
        "ffn_hidden_size": config["intermediate_size"],
        "num_layers": config["num_hidden_layers"],
        "num_attention_heads": config["num_attention_heads"],
        "multi_query_attention": True,
        "multi_query_group_num": config["num_key_value_heads"],
        "kv_channels": config["head_dim"],
        "layernorm_epsilon": config["rms_norm_eps"],
        "rope_ratio": config["rope_parameters"]["rope_theta"] / 10000.0,
        "seq_length": config["max_position_embeddings"],
        "add_qkv_bias": True,
        "add_bias_linear": False,
        "rmsnorm": True,
        "post_layer_norm": True,
        "apply_residual_connection_post_layernorm": False,
        "original_rope": True,
        "eos_token_id": config.get("eos_token_id"),
        "pad_token_id": config.get("pad_token_id"),
    }
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        target = chatglm_name(name)
        if target in tensors:  # k or v after q: append to the fused rows
            tensor = torch.cat((tensors[target], tensor))
        tensors[target] = tensor.contiguous()
    tensors["transformer.rotary_pos_emb.inv_freq"] = torch.zeros(4)  # saved, recomputed
    return chatglm, tensors


def _resave_as_chatglm(directory: Path) -> None:
    from safetensors.torch import load_file, save_file

    config = json.loads((directory / "config.json").read_text())
    state = load_file(directory / "model.safetensors")
    chatglm, tensors = to_chatglm(config, state)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(chatglm, indent=2))


def _randomize(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "norm" in name:  # RMSNorm weights: around 1
                param.copy_(1.0 + 0.1 * noise)
            elif "embed_tokens" in name or "lm_head" in name:
                # Large enough for peaked logits (clear greedy winners), small enough in the
                # layers that attention still moves the residual stream.
                param.copy_((1.0 if "embed_tokens" in name else 0.3) * noise)
            else:
                param.copy_(0.08 * noise)
        for name, buffer in model.named_buffers():
            # DeepSeek-V3's router bias, zero at init, which would hide it being ignored.
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
