"""Qwen2-VL end to end on a tiny random checkpoint, against transformers as the oracle.

Preprocessing equals transformers' Pillow image processor and its torchvision video processor
(pixels, grids; the video processor read from the tiny checkpoint, which has no video config,
as ours is) and its processor's pad expansion (input ids); the vision tower equals
``get_image_features`` / ``get_video_features``; the M-RoPE positions equal ``get_rope_index``;
greedy tokens and their logprobs equal ``generate`` on transformers' own processors' outputs,
in float32, for one image, two images of different sizes, a video and text alone. Batching,
chunked prefill (cutting through an image and its positions), preemption and streaming change
nothing. ``test_qwen2_vl_video.py`` checks the video preprocessing against more settings and
sizes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import transformers
from parity_support import assert_same, tokens
from qwen_vl_support import (
    CASES,
    CLIP,
    GREEDY,
    NUM_NEW_TOKENS,
    TALL,
    VIDEO_ID,
    WIDE,
    Reference,
    chat,
    check_chunked_prefill_and_preemption,
    check_greedy,
    check_ids_features_and_positions,
    check_mixed_batch,
    check_streaming,
    image,
    noise,
    processor_of,
    run,
    video,
)

from ferrollm import LLM
from ferrollm.models.vision.qwen2_vl_images import Qwen2VLImageSettings, preprocess_image
from ferrollm.models.vision.qwen2_vl_video import preprocess_video
from tiny_models import QWEN2VL_ADDED_TOKENS, TINY_SIZES


@pytest.fixture(scope="module")
def reference(tiny_qwen2_vl_dir: Path) -> Reference:
    return Reference.load(tiny_qwen2_vl_dir, transformers.Qwen2VLForConditionalGeneration)


@pytest.fixture(scope="module")
def llm(tiny_qwen2_vl_dir: Path) -> LLM:
    return LLM(tiny_qwen2_vl_dir, device="cpu", dtype="float32")


@pytest.mark.parametrize("size", [(60, 150), (30, 40), (200, 90), (500, 700), (28, 5000)])
def test_image_preprocessing_equals_transformers(
    reference: Reference, llm: LLM, size: tuple[int, int]
) -> None:
    img = noise(*size, seed=sum(size))
    want = reference.image_processor(images=[img], return_tensors="np")
    got = preprocess_image(img, processor_of(llm).image_settings)
    assert [list(got.grid_thw)] == want["image_grid_thw"].tolist()
    np.testing.assert_array_equal(got.pixel_values, want["pixel_values"])


@pytest.mark.parametrize("shape", [(3, 56, 84), (4, 30, 40), (1, 200, 90), (2, 500, 700)])
def test_video_preprocessing_equals_transformers(
    reference: Reference, llm: LLM, shape: tuple[int, int, int]
) -> None:
    frames = video(*shape, seed=sum(shape)).frames
    want = reference.video_processor(videos=[frames], return_tensors="np")
    got = preprocess_video(frames, processor_of(llm).video_settings)
    assert [list(got.grid_thw)] == want["video_grid_thw"].tolist()
    np.testing.assert_array_equal(got.pixel_values, want["pixel_values_videos"])


def test_video_patches_pair_frames_as_images_repeat_one(llm: LLM) -> None:
    """A still video of two frames takes an image's grid (its pixels differ: torchvision's
    resize and the fused normalization, not Pillow's); an odd count repeats the last frame."""
    settings = processor_of(llm).image_settings
    frame = np.asarray(WIDE)
    still = preprocess_video(np.stack([frame, frame]), settings)
    assert still.grid_thw == preprocess_image(WIDE, settings).grid_thw
    padded = preprocess_video(CLIP.frames, settings)  # 3 frames: the last repeated
    again = preprocess_video(CLIP.frames[[0, 1, 2, 2]], settings)
    assert padded.grid_thw[0] == 2
    np.testing.assert_array_equal(padded.pixel_values, again.pixel_values)


@pytest.mark.parametrize("case", sorted(CASES))
def test_prompt_ids_features_and_positions_equal_transformers(
    reference: Reference, llm: LLM, case: str
) -> None:
    check_ids_features_and_positions(reference, llm, CASES[case])


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_tokens_equal_transformers(reference: Reference, llm: LLM, case: str) -> None:
    check_greedy(reference, llm, CASES[case])


def test_a_mixed_batch_equals_each_request_alone(llm: LLM) -> None:
    check_mixed_batch(llm)


def test_chunked_prefill_and_preemption_through_images(tiny_qwen2_vl_dir: Path, llm: LLM) -> None:
    check_chunked_prefill_and_preemption(tiny_qwen2_vl_dir, llm)


def test_a_prefix_cache_hit_keeps_the_positions(tiny_qwen2_vl_dir: Path) -> None:
    llm = LLM(tiny_qwen2_vl_dir, device="cpu", dtype="float32", block_size=4)
    first = run(llm, CASES["one-image"])
    before = llm.engine.scheduler.stats()["num_prefix_hit_blocks"]
    assert_same(run(llm, CASES["one-image"]), first)
    assert llm.engine.scheduler.stats()["num_prefix_hit_blocks"] > before


def test_the_offline_api_takes_images(llm: LLM) -> None:
    prompt, media = CASES["one-image"]
    out = llm.generate({"prompt": prompt, "multi_modal_data": {"image": [WIDE]}}, GREEDY)[0]
    assert_same([out], run(llm, (prompt, media)))


def test_the_offline_api_takes_videos_and_each_kind_in_its_own_list(llm: LLM) -> None:
    """As transformers' processor: the i-th image pad is the i-th image, the i-th video pad
    the i-th video, whichever order the list gives them in."""
    prompt, media = CASES["image-then-video"]
    data = {"image": [TALL], "video": CLIP.frames}
    out = llm.generate({"prompt": prompt, "multi_modal_data": data}, GREEDY)[0]
    assert_same([out], run(llm, (prompt, media)))
    swapped = processor_of(llm).process(prompt, [CLIP, image(TALL)])
    ordered = processor_of(llm).process(prompt, media)
    assert swapped.prompt_token_ids == ordered.prompt_token_ids
    key = [(m.kind, m.digest, m.offset, m.length) for m in ordered.media]
    assert [(m.kind, m.digest, m.offset, m.length) for m in swapped.media] == key


def test_chat_renders_image_parts_as_the_placeholder(llm: LLM) -> None:
    message = {
        "role": "user",
        "content": [
            {"type": "image_pil", "image_pil": WIDE},
            {"type": "text", "text": "what is this?"},
        ],
    }
    out = llm.chat([message], GREEDY)[0]
    assert (
        out.prompt_token_ids
        == processor_of(llm)
        .process(chat("image"), [image(WIDE)], add_special_tokens=False)
        .prompt_token_ids
    )
    assert_same([out], run(llm, CASES["one-image"]))


def test_chat_reads_a_video_file(llm: LLM, tmp_path: Path) -> None:
    """A ``video_url`` part (a local mp4 of six 32x32 frames) is decoded, every frame kept,
    and expanded to 3 temporal x 2x2 merged tokens (each frame resized up to 56x56)."""
    import av

    path = tmp_path / "clip.mp4"
    with av.open(str(path), "w", format="mp4") as file:
        stream = file.add_stream("mpeg4", rate=4)
        stream.width = stream.height = 32
        stream.pix_fmt = "yuv420p"
        for i in range(6):
            pixels = np.full((32, 32, 3), 40 * i, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                file.mux(packet)
        for packet in stream.encode():
            file.mux(packet)
    content = [
        {"type": "video_url", "video_url": {"url": str(path)}},
        {"type": "text", "text": "what happens?"},
    ]
    out = llm.chat([{"role": "user", "content": content}], GREEDY)[0]
    assert out.prompt_token_ids is not None
    assert out.prompt_token_ids.count(VIDEO_ID) == 3 * 4
    assert len(tokens(out)) == NUM_NEW_TOKENS


def test_streamed_equals_non_streamed(llm: LLM) -> None:
    check_streaming(llm)


def test_mismatched_media_is_refused_by_index(llm: LLM) -> None:
    processor = processor_of(llm)
    with pytest.raises(ValueError, match=r"media\[1\]"):
        processor.process(chat("image", "image"), [image(WIDE)])
    with pytest.raises(ValueError, match=r"media\[0\].*0 <\|image_pad\|> placeholders"):
        processor.process(chat("video"), [image(WIDE)])
    assert processor.placeholder("video") == "<|vision_start|><|video_pad|><|vision_end|>"
    assert set(QWEN2VL_ADDED_TOKENS) >= {"<|image_pad|>", "<|video_pad|>"}


def test_dummy_weights_build_the_tower(tiny_qwen2_vl_dir: Path) -> None:
    llm = LLM(tiny_qwen2_vl_dir, device="cpu", dtype="float32", load_format="dummy")
    (out,) = run(llm, CASES["one-image"])
    assert len(tokens(out)) == NUM_NEW_TOKENS


def test_image_settings_read_the_older_pixel_keys() -> None:
    settings = Qwen2VLImageSettings.from_dict({"min_pixels": 100, "max_pixels": 2000})
    assert (settings.min_pixels, settings.max_pixels) == (100, 2000)


def test_compiled_decode_keeps_text_steps_and_runs_media_steps_eagerly(
    tiny_qwen2_vl_dir: Path, llm: LLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compile`` on: steps holding an M-RoPE request pass [3, T] positions and run eagerly,
    text-only decode steps take the graphs (compiled before M-RoPE was switched on, and
    equal to it on 1-D positions); every output equals the eager engine's."""
    monkeypatch.setenv("FERROLLM_COMPILE_CACHE", str(tmp_path))
    cases = [CASES[c] for c in ("one-image", "text-only", "video")]
    eager = [run(llm, case)[0] for case in cases]
    compiled = LLM(tiny_qwen2_vl_dir, device="cpu", dtype="float32", compile="on", max_num_seqs=2)
    assert compiled.engine.runner.compiled is not None
    assert_same(run(compiled, *cases), eager)
    assert_same([run(compiled, CASES["text-only"])[0]], [eager[1]])  # decodes on the graphs


def test_the_original_checkpoint_layout_reads_as_a_qwen2() -> None:
    """Qwen2-VL's own config.json keeps the decoder's fields at the top level with
    ``rope_scaling: {type: mrope}``; transformers 5 may name tensors ``model.language_model.*``
    and ``model.visual.*``."""
    from ferrollm.models.config import ModelConfig
    from ferrollm.models.qwen2_vl_text import mrope_section, stored_text_names, text_config

    raw = {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        **TINY_SIZES,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "vision_config": {"depth": 2},
        "image_token_id": 302,
    }
    config = ModelConfig.from_hf_dict(text_config(raw), {})
    assert (config.architecture, config.rope_theta, config.rope_scaling) == (
        "Qwen2ForCausalLM",
        1000000.0,
        None,
    )
    assert config.attention_bias and not config.tie_word_embeddings
    nested = {"model_type": "qwen2_vl", "text_config": {**TINY_SIZES, "tie_word_embeddings": True}}
    assert ModelConfig.from_hf_dict(text_config(nested), {}).tie_word_embeddings
    assert mrope_section(raw) == (2, 3, 3)
    stored = {
        "model.language_model.layers.0.mlp.up_proj.weight": "a",
        "model.visual.blocks.0.attn.qkv.weight": "a",
        "visual.merger.mlp.0.bias": "a",
        "model.embed_tokens.weight": "a",
        "lm_head.weight": "a",
    }
    assert stored_text_names(stored) == {
        "model.layers.0.mlp.up_proj.weight": "model.language_model.layers.0.mlp.up_proj.weight",
        "model.embed_tokens.weight": "model.embed_tokens.weight",
        "lm_head.weight": "lm_head.weight",
    }
