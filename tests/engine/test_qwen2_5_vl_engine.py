"""Qwen2.5-VL end to end on a tiny random checkpoint, against transformers as the oracle.

The tiny tower (``tiny_models.build_tiny_qwen2_5_vl``) has one window-attention block (windows
of 2x2 merged tokens, so the wide image's 2x5 grid has a clipped window) and one full-attention
block. Its features equal ``get_image_features`` / ``get_video_features``; prompt ids and the
M-RoPE positions equal transformers' (a video's temporal positions spaced by
``tokens_per_second * second_per_grid_ts``, from the sampled frame rate: 1 fps gives steps of 4,
three kept frames of six at 3 fps steps of 2.67, rounded down); greedy tokens and their
logprobs equal ``generate`` in float32 for one image, two images of different sizes, videos and
text alone. Batching, chunked prefill through an image, preemption and streaming change
nothing. Preprocessing is Qwen2-VL's (tested there).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import transformers
from parity_support import tokens
from qwen_vl_support import (
    CASES,
    CLIP,
    GREEDY,
    NUM_NEW_TOKENS,
    Case,
    Reference,
    chat,
    check_chunked_prefill_and_preemption,
    check_greedy,
    check_ids_features_and_positions,
    check_mixed_batch,
    check_streaming,
    fps_of,
    processor_of,
    run,
)

from ferrollm import LLM
from ferrollm.multimodal.qwen2_vl import sampled_fps
from tiny_models import QWEN2_5_VL_VISION_SIZES, TINY_SIZES

#: Frames 0, 2, 4 of a 6-frame 3 fps stream: 1.5 fps kept, 1.33 s a temporal patch.
SAMPLED = dataclasses.replace(CLIP, indices=np.arange(3) * 2, fps=3.0, total_frames=6)
QWEN2_5_CASES: dict[str, Case] = {
    **CASES,
    "sampled-video": (chat("video", text="what happens"), [SAMPLED]),
}


@pytest.fixture(scope="module")
def reference(tiny_qwen2_5_vl_dir: Path) -> Reference:
    model_class = transformers.Qwen2_5_VLForConditionalGeneration
    return Reference.load(tiny_qwen2_5_vl_dir, model_class, timed=True)


@pytest.fixture(scope="module")
def llm(tiny_qwen2_5_vl_dir: Path) -> LLM:
    return LLM(tiny_qwen2_5_vl_dir, device="cpu", dtype="float32")


@pytest.mark.parametrize("case", sorted(QWEN2_5_CASES))
def test_prompt_ids_features_and_positions_equal_transformers(
    reference: Reference, llm: LLM, case: str
) -> None:
    check_ids_features_and_positions(reference, llm, QWEN2_5_CASES[case])


@pytest.mark.parametrize("case", sorted(QWEN2_5_CASES))
def test_greedy_tokens_equal_transformers(reference: Reference, llm: LLM, case: str) -> None:
    check_greedy(reference, llm, QWEN2_5_CASES[case])


def test_a_mixed_batch_equals_each_request_alone(llm: LLM) -> None:
    check_mixed_batch(llm)


def test_chunked_prefill_and_preemption_through_images(tiny_qwen2_5_vl_dir: Path, llm: LLM) -> None:
    check_chunked_prefill_and_preemption(tiny_qwen2_5_vl_dir, llm)


def test_streamed_equals_non_streamed(llm: LLM) -> None:
    check_streaming(llm)


def test_a_video_s_positions_follow_its_frame_rate(llm: LLM) -> None:
    """The same frames at another rate: the same features, other temporal positions, and
    another digest (so no prefix-cache block is shared between them)."""
    processor = processor_of(llm)
    prompt, _ = QWEN2_5_CASES["video"]
    (one_fps,) = processor.process(prompt, [CLIP]).media
    (sampled,) = processor.process(prompt, [SAMPLED]).media
    assert one_fps.digest != sampled.digest
    num_tokens = one_fps.offset + one_fps.length + 4
    times = [processor.rope_positions(num_tokens, [m]).table[0] for m in (one_fps, sampled)]
    span = slice(one_fps.offset, one_fps.offset + one_fps.length)
    start = one_fps.offset
    assert sorted(set(times[0][span] - start)) == [0, 4]  # 2 tokens/s x 2 s
    assert sorted(set(times[1][span] - start)) == [0, 2]  # int(2.67)


@pytest.mark.parametrize(
    ("fps", "indices", "total"), [(1.0, [0, 1, 2], 3), (3.0, [0, 2, 4], 6), (0.0, [0, 1], 2)]
)
def test_sampled_fps_is_transformers(fps: float, indices: list[int], total: int) -> None:
    item = dataclasses.replace(CLIP, indices=np.asarray(indices), fps=fps, total_frames=total)
    assert sampled_fps(item) == fps_of(item)


def test_the_offline_api_takes_videos_at_the_default_rate(llm: LLM) -> None:
    """Bare frames have no rate: transformers' 24 fps, so both frame groups sit at time 0."""
    prompt, _ = QWEN2_5_CASES["video"]
    out = llm.generate({"prompt": prompt, "multi_modal_data": {"video": CLIP.frames}}, GREEDY)[0]
    unknown = dataclasses.replace(CLIP, fps=0.0)
    processed = processor_of(llm).process(prompt, [unknown])
    assert out.prompt_token_ids == processed.prompt_token_ids
    (item,) = processed.media
    table = processor_of(llm).rope_positions(len(processed.prompt_token_ids), [item]).table
    assert set(table[0][item.offset : item.offset + item.length]) == {item.offset}


def test_dummy_weights_build_the_tower(tiny_qwen2_5_vl_dir: Path) -> None:
    llm = LLM(tiny_qwen2_5_vl_dir, device="cpu", dtype="float32", load_format="dummy")
    (out,) = run(llm, CASES["one-image"])
    assert len(tokens(out)) == NUM_NEW_TOKENS


def test_the_original_config_layout_reads() -> None:
    """Qwen2.5-VL's own config.json: the decoder's fields at the top level, the tower's width
    as ``vision_config.hidden_size`` and the text width as ``out_hidden_size``."""
    from ferrollm.models.config import ModelConfig
    from ferrollm.models.media_text import media_family, text_config
    from ferrollm.models.vision.qwen2_vl import Qwen2VLVisionConfig

    raw = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        **TINY_SIZES,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "vision_config": {**QWEN2_5_VL_VISION_SIZES, "in_chans": 3, "model_type": "qwen2_5_vl"},
    }
    assert media_family(raw) == "qwen2_5_vl"
    config = ModelConfig.from_hf_dict(text_config("qwen2_5_vl", raw), {})
    assert config.architecture == "Qwen2ForCausalLM"
    vision = Qwen2VLVisionConfig.from_hf_dict(raw)
    assert (vision.embed_dim, vision.hidden_size, vision.window_units) == (32, 64, 2)
    assert vision.full_attention_blocks == frozenset({1})
    assert vision.tokens_per_second == 2


def test_a_window_under_one_merged_token_is_refused() -> None:
    from ferrollm.models.config_fields import UnsupportedModelError
    from ferrollm.models.vision.qwen2_vl import Qwen2VLVisionConfig

    raw = {"model_type": "qwen2_5_vl", "vision_config": {"window_size": 14}}
    with pytest.raises(UnsupportedModelError, match="window_size"):
        Qwen2VLVisionConfig.from_hf_dict(raw)


def test_segments_of_one_length_batch_as_each_alone() -> None:
    """The tower's attention runs a batched call per segment length (windows, frames): it
    equals attention within each segment on its own."""
    from itertools import pairwise

    import torch
    import torch.nn.functional as F

    from ferrollm.models.vision.qwen2_vl import _segment_attention

    q, k, v = torch.randn(3, 27, 2, 8).unbind(0)
    bounds = [0, 5, 10, 13, 20, 20, 27]  # lengths 5, 5, 3, 7, 0 and 7
    got = _segment_attention(q, k, v, bounds)
    for start, end in pairwise(bounds):
        if end == start:
            continue
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
        want = F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1)
        torch.testing.assert_close(got[start:end], want, atol=1e-6, rtol=1e-5)
