"""What the Qwen2-VL and Qwen2.5-VL parity tests share: the tiny media, the prompts, transformers
as the oracle (its image processor's pixels, its processor's pad expansion, ``generate``) and
the checks both families must pass against it.

transformers' video processor needs torchvision, which is absent here: the oracle takes our
video patches (checked against the image path's layout in the Qwen2-VL tests), and for
Qwen2.5-VL each video's ``second_per_grid_ts`` as its processor computes it, from the frame
rate transformers' ``VideoMetadata`` gives the video's frames.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from parity_support import (
    MEDIA_LOGPROB_TOLERANCE,
    assert_same,
    assert_stream_adds_up,
    busy_media_options,
    hf_greedy_media,
    logprobs_of,
    run_async,
    tokens,
)
from PIL import Image

from ferrollm import LLM, SamplingParams
from ferrollm.engine import AsyncEngine, EngineRequest, RequestOutput
from ferrollm.media.items import ImageMedia, MediaItem, VideoMedia
from ferrollm.multimodal.qwen2_vl import Qwen2VLProcessor

NUM_NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=0)
#: Chunks of 8 tokens (every image's run is cut), KV blocks of 4 tokens, too few for all the
#: prompts at once: chunked prefill through images and preemption.
BUSY = busy_media_options(24)
IMAGE_ID, VIDEO_ID = 302, 303
PAD = {"image": "<|image_pad|>", "video": "<|video_pad|>"}


def noise(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def video(count: int, height: int, width: int, seed: int) -> VideoMedia:
    """``count`` random frames, every frame of a 1 fps stream."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (count, height, width, 3), dtype=np.uint8)
    times = np.arange(count, dtype=np.float64)
    return VideoMedia(frames, times, np.arange(count), 1.0, count, float(count), "mp4")


def image(img: Image.Image) -> ImageMedia:
    return ImageMedia(img, "png", img.width, img.height)


WIDE = noise(60, 150, 1)  # 4 x 10 patches: 10 tokens, rows != columns
SMALL = noise(30, 40, 2)  # resized up to the minimum
TALL = noise(200, 90, 3)
CLIP = video(3, 56, 84, 4)  # 3 frames: padded to 4, 2 temporal patches


def chat(*kinds: str, text: str = "what is this") -> str:
    parts = "".join(f"<|vision_start|>{PAD[k]}<|vision_end|>" for k in kinds)
    return f"<|im_start|>user\n{parts}{text}?<|im_end|>\n<|im_start|>assistant\n"


Case = tuple[str, list[MediaItem]]

CASES: dict[str, Case] = {
    "one-image": (chat("image"), [image(WIDE)]),
    "two-images-of-different-sizes": (
        chat("image", "image", text="compare them"),
        [image(SMALL), image(TALL)],
    ),
    "video": (chat("video", text="what happens"), [CLIP]),
    "text-only": (chat(text="describe a red square"), []),
    "image-then-video": (chat("image", "video", text="which one moves"), [image(TALL), CLIP]),
}


@dataclasses.dataclass
class Reference:
    """transformers' model, its Pillow image processor, its (torchvision) video processor and
    tokenizer over a tiny checkpoint; ``timed``: the model takes each video's
    ``second_per_grid_ts`` (Qwen2.5-VL). The image processor is pinned to the Pillow class:
    with torchvision present transformers would pick its torchvision one, whose pixels differ
    (docs/multimodal.md)."""

    model: Any
    image_processor: Any
    video_processor: Any
    tokenizer: Any
    timed: bool = False

    @classmethod
    def load(cls, directory: Path, model_class: Any, *, timed: bool = False) -> Reference:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

        model = model_class.from_pretrained(directory, dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None  # as ignore_eos
        return cls(
            model,
            Qwen2VLImageProcessorPil.from_pretrained(directory),
            Qwen2VLVideoProcessor.from_pretrained(directory),
            transformers.AutoTokenizer.from_pretrained(directory),
            timed,
        )

    def inputs(self, prompt: str, media: list[MediaItem], processor: Qwen2VLProcessor) -> dict:
        """What transformers' processor gives: pixels from its image and video processors,
        each pad repeated per merged token, ``mm_token_type_ids``."""
        extra = self._pixels(media, processor)
        grids = iter(extra.get("image_grid_thw", torch.zeros(0, 3)).tolist())
        video_grids = iter(extra.get("video_grid_thw", torch.zeros(0, 3)).tolist())
        text, rest = "", prompt
        for item in media:
            kind = "image" if isinstance(item, ImageMedia) else "video"
            before, _, rest = rest.partition(PAD[kind])
            t, h, w = next(grids if kind == "image" else video_grids)
            text += before + PAD[kind] * (int(t * h * w) // 4)
        ids = self.tokenizer(text + rest, return_tensors="pt")
        types = torch.zeros_like(ids["input_ids"])
        types[ids["input_ids"] == IMAGE_ID] = 1
        types[ids["input_ids"] == VIDEO_ID] = 2
        return {**ids, **extra, "mm_token_type_ids": types}

    def _pixels(self, media: list[MediaItem], processor: Qwen2VLProcessor) -> dict:
        extra: dict[str, torch.Tensor] = {}
        images = [m.image for m in media if isinstance(m, ImageMedia)]
        if images:
            out = self.image_processor(images=images, return_tensors="pt")
            extra |= {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        videos = [m for m in media if isinstance(m, VideoMedia)]
        if not videos:
            return extra
        out = self.video_processor(videos=[m.frames for m in videos], return_tensors="pt")
        extra["pixel_values_videos"] = out["pixel_values_videos"]
        extra["video_grid_thw"] = out["video_grid_thw"]
        if self.timed:
            step = processor.video_settings.temporal_patch_size
            extra["second_per_grid_ts"] = torch.tensor([step / fps_of(m) for m in videos])
        return extra

    def greedy(self, inputs: dict) -> tuple[list[int], list[float]]:
        return hf_greedy_media(self.model, inputs, NUM_NEW_TOKENS)


def fps_of(item: VideoMedia) -> float:
    """The rate of ``item``'s frames as transformers' ``VideoMetadata`` gives it."""
    from transformers.video_utils import VideoMetadata

    metadata = VideoMetadata(
        total_num_frames=item.total_frames,
        fps=item.fps or None,
        frames_indices=list(item.indices),
    )
    return float(metadata.sampled_fps)


def processor_of(llm: LLM) -> Qwen2VLProcessor:
    processor = llm.engine.multimodal
    assert isinstance(processor, Qwen2VLProcessor)
    return processor


def request(llm: LLM, request_id: str, prompt: str, media: list[MediaItem]) -> EngineRequest:
    processed = processor_of(llm).process(prompt, media)
    return dataclasses.replace(
        EngineRequest.of(request_id, processed.prompt_token_ids, GREEDY), media=processed.media
    )


def run(llm: LLM, *cases: Case) -> list[RequestOutput]:
    """Each case through the engine together, outputs in case order."""
    engine = llm.engine
    for i, (prompt, media) in enumerate(cases):
        engine.add_request(request(llm, f"r{i}", prompt, media))
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert isinstance(out, RequestOutput)
            if out.finished:
                done[out.request_id] = out
    return [done[f"r{i}"] for i in range(len(cases))]


def check_ids_features_and_positions(reference: Reference, llm: LLM, case: Case) -> None:
    """Our prompt ids, encoder features and M-RoPE table and delta equal transformers'."""
    prompt, media = case
    processor = processor_of(llm)
    inputs = reference.inputs(prompt, media, processor)
    processed = processor.process(prompt, media)
    assert processed.prompt_token_ids == inputs["input_ids"][0].tolist()
    assert [m.kind for m in processed.media] == [
        "image" if isinstance(m, ImageMedia) else "video" for m in media
    ]
    cache = llm.engine.encoder_cache
    assert cache is not None
    ours = cache.get(processed.media)
    model = reference.model.model
    with torch.no_grad():
        want = []
        if "pixel_values" in inputs:
            want += model.get_image_features(
                inputs["pixel_values"], inputs["image_grid_thw"]
            ).pooler_output
        if "pixel_values_videos" in inputs:
            want += model.get_video_features(
                inputs["pixel_values_videos"], inputs["video_grid_thw"]
            ).pooler_output
    for got, expected in zip(ours, want, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    if not media:
        return
    rope = processor.rope_positions(len(processed.prompt_token_ids), processed.media)
    positions, delta = model.get_rope_index(
        inputs["input_ids"],
        inputs["mm_token_type_ids"],
        inputs.get("image_grid_thw"),
        inputs.get("video_grid_thw"),
        second_per_grid_ts=inputs.get("second_per_grid_ts"),
    )
    np.testing.assert_array_equal(rope.table, positions[:, 0].numpy())
    assert rope.delta == int(delta[0, 0])
    assert rope.delta < 0  # the greedy checks would not see a dropped delta otherwise


def check_greedy(reference: Reference, llm: LLM, case: Case) -> None:
    """Greedy tokens equal ``generate``'s and their logprobs agree to rounding."""
    prompt, media = case
    want_tokens, want_logprobs = reference.greedy(
        reference.inputs(prompt, media, processor_of(llm))
    )
    (got,) = run(llm, case)
    assert tokens(got) == want_tokens
    assert np.allclose(logprobs_of(got), want_logprobs, atol=MEDIA_LOGPROB_TOLERANCE, rtol=0)


def check_mixed_batch(llm: LLM) -> None:
    """Images, a video and text in one batch give what each gives alone."""
    cases = [CASES[c] for c in ("one-image", "text-only", "video", "two-images-of-different-sizes")]
    alone = [run(llm, case)[0] for case in cases]
    assert_same(run(llm, *cases), alone)


def check_chunked_prefill_and_preemption(directory: Path, llm: LLM) -> None:
    """8-token chunks cutting through images and preemption (`BUSY`) change nothing."""
    cases = [CASES[c] for c in ("two-images-of-different-sizes", "one-image", "video", "text-only")]
    unchunked = [run(llm, case)[0] for case in cases]
    busy = LLM(directory, device="cpu", **BUSY)
    assert_same(run(busy, *cases), unchunked)
    assert busy.engine.scheduler.stats()["num_preemptions"] > 0


def check_streaming(llm: LLM) -> None:
    """An image request streamed adds up to what it gives unstreamed."""
    prompt, media = CASES["one-image"]

    async def body(engine: AsyncEngine) -> list[RequestOutput]:
        return [o async for o in engine.generate(request(llm, "stream-0", prompt, media))]

    streamed = assert_stream_adds_up(run_async(llm, body))
    assert_same([streamed], run(llm, (prompt, media)))
