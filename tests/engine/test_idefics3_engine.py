"""Idefics3 / SmolVLM served by the engine, against transformers on the tiny checkpoint.

The oracle is ``Idefics3ForConditionalGeneration.generate`` (greedy, float32) on
``Idefics3Processor``'s outputs for the same prompt and images. Our side: the checkpoint's
Llama decoder through the engine, the images through our processor and vision tower, their
features spliced at the ``<image>`` tokens each step. Also: a mixed batch, streams, the
encoder cache, the prefix cache's per-block image keys, chunked prefill through an image,
preemption, the offline chat API, and refusals.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from parity_support import MEDIA_LOGPROB_TOLERANCE as LOGPROB_TOLERANCE
from parity_support import (
    assert_same,
    assert_stream_adds_up,
    busy_media_options,
    hf_greedy_media,
    logprobs_of,
    tokens,
)
from PIL import Image

from ferrollm import LLM, SamplingParams
from ferrollm.engine import AsyncEngine, EngineRequest, RequestOutput
from ferrollm.media.items import ImageMedia
from ferrollm.multimodal.inputs import MediaInput
from ferrollm.tokenizer import ChatTemplate

NUM_NEW_TOKENS = 8
#: Greedy, with each chosen token's logprob: the tiny random model's tokens barely depend on
#: the image's pixels, its logprobs do (a splice off by one row shows there, not in tokens).
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=0)
#: Chunks of 8 tokens (every image's 16-token runs are cut), 4 seats and a KV cache of 48
#: blocks of 4 tokens (2 KiB each), too small for three image prompts at once: preemption.
BUSY = busy_media_options(48)
#: A chat template that only walks content parts, as SmolVLM's does (the tiny checkpoint's
#: own prints content as a string).
PARTS_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def noise(height: int, width: int, seed: int) -> Image.Image:
    """A seeded RGB noise image."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


WIDE = noise(90, 200, 1)  # a 1 x 2 grid plus the global tile
SMALL = noise(30, 50, 2)  # resized up: 2 x 2 plus global
TALL = noise(200, 90, 3)  # 2 x 1 plus global
#: WIDE's size, other pixels (noise images all read alike to the tiny random model).
GRADIENT = Image.fromarray(
    np.tile(np.linspace(0, 255, 200, dtype=np.uint8)[None, :, None], (90, 1, 3)), "RGB"
)
ONE_IMAGE = "User: what is in <image> this picture?"
TWO_IMAGES = "User: compare <image> and <image>, please."
TEXT_ONLY = "User: describe a red square."


@dataclasses.dataclass
class Reference:
    """transformers' processor and model over the tiny checkpoint."""

    processor: Any
    model: Any

    def inputs(self, prompt: str, images: list[Image.Image], **kwargs: Any) -> Any:
        if images:
            return self.processor(text=prompt, images=[images], return_tensors="pt", **kwargs)
        return self.processor.tokenizer(prompt, return_tensors="pt", **kwargs)

    def greedy(
        self, prompt: str, images: list[Image.Image], **kwargs: Any
    ) -> tuple[list[int], list[float]]:
        """Greedy tokens and each one's logprob."""
        inputs = self.inputs(prompt, images, **kwargs)
        return hf_greedy_media(self.model, inputs, NUM_NEW_TOKENS)


@pytest.fixture(scope="module")
def reference(tiny_idefics3_dir: Path) -> Reference:
    model = transformers.Idefics3ForConditionalGeneration.from_pretrained(
        tiny_idefics3_dir, dtype=torch.float32
    ).eval()
    model.generation_config.eos_token_id = None  # as ignore_eos: always NUM_NEW_TOKENS
    # Pillow's image processor, as ours: with torchvision present the default would be its.
    processor = transformers.AutoProcessor.from_pretrained(tiny_idefics3_dir, backend="pil")
    return Reference(processor, model)


@pytest.fixture(scope="module")
def llm(tiny_idefics3_dir: Path) -> LLM:
    return LLM(tiny_idefics3_dir, device="cpu", dtype="float32")


def mm(prompt: str, *images: Image.Image) -> dict[str, Any]:
    return {"prompt": prompt, "multi_modal_data": {"image": list(images)}}


def run_alone(llm: LLM, prompt: str | dict[str, Any]) -> RequestOutput:
    return llm.generate(prompt, GREEDY)[0]


def prefix_hits(llm: LLM) -> int:
    return int(llm.engine.scheduler.stats()["num_prefix_hit_blocks"])


CASES = {
    "one-image": (ONE_IMAGE, [WIDE]),
    "two-images-of-different-sizes": (TWO_IMAGES, [SMALL, TALL]),
    "text-only": (TEXT_ONLY, []),
}


@pytest.mark.parametrize("case", CASES)
def test_greedy_tokens_equal_transformers(llm: LLM, reference: Reference, case: str) -> None:
    prompt, images = CASES[case]
    output = llm.generate(mm(prompt, *images) if images else prompt, GREEDY)[0]
    assert output.prompt_token_ids == reference.inputs(prompt, images)["input_ids"][0].tolist()
    want_tokens, want_logprobs = reference.greedy(prompt, images)
    assert tokens(output) == want_tokens
    assert np.allclose(logprobs_of(output), want_logprobs, atol=LOGPROB_TOLERANCE, rtol=0)


def test_beam_search_with_an_image_equals_transformers(llm: LLM, reference: Reference) -> None:
    params = SamplingParams(use_beam_search=True, n=2, max_tokens=6, ignore_eos=True)
    output = llm.generate(mm(ONE_IMAGE, WIDE), params)[0]
    inputs = reference.inputs(ONE_IMAGE, [WIDE])
    with torch.no_grad():
        beams = reference.model.generate(
            **inputs, max_new_tokens=6, do_sample=False, num_beams=2, num_return_sequences=2
        )
    want = beams[:, inputs["input_ids"].shape[1] :].tolist()
    assert sorted(c.token_ids for c in output.outputs) == sorted(want)


def test_media_compose_with_a_prompt_table(llm: LLM) -> None:
    """A virtual token whose table row is token 42's embedding, in an image prompt, reads as
    token 42 (both overrides apply in the same step)."""
    processor = llm.engine.multimodal
    assert processor is not None
    processed = processor.process(ONE_IMAGE, [ImageMedia(WIDE, "png", WIDE.width, WIDE.height)])
    ids = list(processed.prompt_token_ids)
    vocab = llm.engine.model_config.vocab_size
    embedding = llm.engine.runner.model.model.embed_tokens.weight  # type: ignore[attr-defined]
    table = embedding[42:43].detach().float().numpy()

    def run(prompt_ids: list[int], **fields: Any) -> RequestOutput:
        request = dataclasses.replace(
            EngineRequest.of(f"table-{len(fields)}", prompt_ids, GREEDY),
            media=processed.media,
            **fields,
        )
        llm.engine.add_request(request)
        finished = []
        while llm.engine.has_unfinished_requests():
            finished += [
                o for o in llm.engine.step() if isinstance(o, RequestOutput) and o.finished
            ]
        return finished[0]

    plain = run([*ids[:-1], 42, ids[-1]])
    virtual = run([*ids[:-1], vocab, ids[-1]], prompt_table=table)
    assert_same([virtual], [plain])


def test_processor_spans_are_the_image_token_runs(llm: LLM) -> None:
    processor = llm.engine.multimodal
    assert processor is not None and processor.placeholder("image") == "<image>"
    media = [ImageMedia(image, "png", image.width, image.height) for image in (SMALL, TALL)]
    processed = processor.process(TWO_IMAGES, media)
    image_id = llm.engine.tokenizer.encode("<image>", add_special_tokens=False)[0]
    spans = {p for item in processed.media for p in range(item.offset, item.offset + item.length)}
    assert spans == {i for i, t in enumerate(processed.prompt_token_ids) if t == image_id}
    # Both resized to a longest edge of 128: SMALL a 2 x 2 grid, TALL 2 x 1, each + global.
    assert len(processed.media) == 5 + 3
    with pytest.raises(ValueError, match=r"media\[1\]"):
        processor.process(ONE_IMAGE, media)


def test_a_mixed_batch_equals_each_request_alone(llm: LLM) -> None:
    prompts: list[Any] = [mm(ONE_IMAGE, WIDE), TEXT_ONLY, mm(TWO_IMAGES, SMALL, TALL)]
    alone = [run_alone(llm, p) for p in prompts]
    assert_same(llm.generate(prompts, GREEDY), alone)


def test_streamed_equals_non_streamed(llm: LLM) -> None:
    processor = llm.engine.multimodal
    assert processor is not None
    media = [ImageMedia(WIDE, "png", WIDE.width, WIDE.height)]
    processed = processor.process(ONE_IMAGE, media)
    request = dataclasses.replace(
        EngineRequest.of("stream-0", processed.prompt_token_ids, GREEDY), media=processed.media
    )
    engine = AsyncEngine(llm.engine)
    assert engine.multimodal is processor

    async def body() -> list[RequestOutput]:
        try:
            return [output async for output in engine.generate(request)]
        finally:
            engine.shutdown()

    streamed = assert_stream_adds_up(asyncio.run(body()))
    assert_same([streamed], [run_alone(llm, mm(ONE_IMAGE, WIDE))])


def test_the_encoder_cache_encodes_a_repeated_image_once(tiny_idefics3_dir: Path) -> None:
    llm = LLM(tiny_idefics3_dir, device="cpu", dtype="float32", enable_prefix_caching=False)
    cache = llm.engine.encoder_cache
    assert cache is not None
    first = run_alone(llm, mm(ONE_IMAGE, WIDE))
    assert (cache.misses, cache.hits) == (3, 0)  # three tiles, each encoded once
    again = run_alone(llm, mm("User: again, <image>?", WIDE))
    assert cache.misses == 3 and cache.hits == 3
    cache.capacity_bytes = 0  # off: encoded at every use, same outputs
    assert_same([run_alone(llm, mm(ONE_IMAGE, WIDE))], [first])
    assert_same([run_alone(llm, mm("User: again, <image>?", WIDE))], [again])
    assert cache.misses == 9 and len(cache) == 0
    stats = llm.engine.stats()
    assert (stats["encoder_cache_hits"], stats["encoder_cache_misses"]) == (3, 9)


def first_image_offset(llm: LLM, prompt: str) -> int:
    """Where the first image's span starts in ``prompt`` as the engine expands it."""
    processor = llm.engine.multimodal
    assert processor is not None
    media = [ImageMedia(WIDE, "png", WIDE.width, WIDE.height)]
    return processor.process(prompt, media).media[0].offset


def test_the_prefix_cache_keys_blocks_by_their_images(tiny_idefics3_dir: Path) -> None:
    llm = LLM(tiny_idefics3_dir, device="cpu", dtype="float32", block_size=4)
    first = run_alone(llm, mm(ONE_IMAGE, WIDE))
    before = prefix_hits(llm)
    assert_same([run_alone(llm, mm(ONE_IMAGE, WIDE))], [first])
    assert prefix_hits(llm) > before, "the same prompt and image share blocks"
    before = prefix_hits(llm)
    other = run_alone(llm, mm(ONE_IMAGE, GRADIENT))  # the same size: the same tile grid
    num_text_blocks = first_image_offset(llm, ONE_IMAGE) // 4
    assert prefix_hits(llm) == before + num_text_blocks, "only the text before the image"
    assert tokens(other) != tokens(first)


def test_a_shared_text_prefix_before_different_images_hits(tiny_idefics3_dir: Path) -> None:
    prompt = "User: a long shared preamble, the same for every request. what is in <image>?"
    llm = LLM(tiny_idefics3_dir, device="cpu", dtype="float32", block_size=4)
    num_text_blocks = first_image_offset(llm, prompt) // 4
    assert num_text_blocks >= 3
    run_alone(llm, mm(prompt, WIDE))
    before = prefix_hits(llm)
    got = run_alone(llm, mm(prompt, GRADIENT))
    assert prefix_hits(llm) == before + num_text_blocks
    uncached = LLM(tiny_idefics3_dir, device="cpu", dtype="float32", enable_prefix_caching=False)
    assert_same([got], [run_alone(uncached, mm(prompt, GRADIENT))])


def test_chunked_prefill_and_preemption_through_images(tiny_idefics3_dir: Path, llm: LLM) -> None:
    prompts: list[Any] = [
        mm(ONE_IMAGE, WIDE),
        mm(TWO_IMAGES, SMALL, TALL),
        TEXT_ONLY,
        mm(TWO_IMAGES, TALL, WIDE),
    ]
    unchunked = [run_alone(llm, p) for p in prompts]
    busy = LLM(tiny_idefics3_dir, device="cpu", **BUSY)
    assert_same(busy.generate(prompts, GREEDY), unchunked)
    stats = busy.engine.scheduler.stats()
    assert stats["num_preemptions"] > 0


def test_a_small_encoder_budget_spreads_images_over_steps(
    tiny_idefics3_dir: Path, llm: LLM
) -> None:
    """With room for one image's tiles per step, each prompt's chunks stop before the next
    image until a later step; the tokens are the same as unhindered."""
    prompts: list[Any] = [mm(TWO_IMAGES, SMALL, TALL), mm(ONE_IMAGE, WIDE), TEXT_ONLY]
    unhindered = [run_alone(llm, p) for p in prompts]
    tight = LLM(tiny_idefics3_dir, device="cpu", dtype="float32", max_num_encoder_tokens=1)
    assert tight.engine.scheduler.config.max_num_encoder_tokens == 1
    assert_same(tight.generate(prompts, GREEDY), unhindered)
    assert llm.engine.scheduler.config.max_num_encoder_tokens >= 4096


def test_chat_renders_image_parts_through_the_template(llm: LLM) -> None:
    buffer = io.BytesIO()
    WIDE.save(buffer, format="PNG")
    data_uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    conversation = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is in "},
                {"type": "image_url", "image_url": {"url": data_uri}},
                {"type": "text", "text": " and "},
                {"type": "image_pil", "image_pil": SMALL},
            ],
        }
    ]
    rendered = "<|im_start|>user\nwhat is in <image> and <image><|im_end|>\n<|im_start|>assistant\n"
    tokenizer = llm.engine.tokenizer
    processor = llm.engine.multimodal
    assert processor is not None
    media = [ImageMedia(i, "png", i.width, i.height) for i in (WIDE, SMALL)]
    expected = processor.process(rendered, media, add_special_tokens=False).prompt_token_ids
    by_string = llm.chat(conversation, GREEDY)[0]
    assert by_string.prompt == rendered and by_string.prompt_token_ids == expected
    original = tokenizer.chat_template
    tokenizer.chat_template = ChatTemplate(PARTS_TEMPLATE)
    try:
        by_parts = llm.chat(conversation, GREEDY)[0]
        text_only = llm.chat([{"role": "user", "content": "hi"}], GREEDY)[0]
    finally:
        tokenizer.chat_template = original
    assert by_parts.prompt == rendered
    assert_same([by_parts], [by_string])
    assert text_only.prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_media_on_a_text_only_engine_is_refused(tiny_model_factory: Any) -> None:
    llm = LLM(tiny_model_factory("llama3"), device="cpu", dtype="float32")
    assert llm.engine.multimodal is None
    item = MediaInput("image", "x", {}, 0, 1)
    request = dataclasses.replace(EngineRequest.of("r", [1, 2, 3]), media=(item,))
    with pytest.raises(ValueError, match="`media`"):
        llm.engine.add_request(request)
    with pytest.raises(ValueError, match="multi_modal_data"):
        llm.generate(mm("a <image>", SMALL))
    assert not llm.engine.has_unfinished_requests()


def test_dummy_weights_give_a_random_vision_tower(tiny_idefics3_dir: Path, tmp_path: Path) -> None:
    for name in ("config.json", "preprocessor_config.json", "processor_config.json"):
        if (tiny_idefics3_dir / name).is_file():
            (tmp_path / name).write_bytes((tiny_idefics3_dir / name).read_bytes())
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tmp_path / name).write_bytes((tiny_idefics3_dir / name).read_bytes())
    llm = LLM(tmp_path, device="cpu", dtype="float32", load_format="dummy")  # no weights here
    assert len(tokens(run_alone(llm, mm(ONE_IMAGE, WIDE)))) == NUM_NEW_TOKENS


def test_tensor_parallelism_is_refused_by_name(tiny_idefics3_dir: Path) -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(tiny_idefics3_dir, device="cpu", dtype="float32", tensor_parallel_size=2)


def test_media_spans_outside_the_prompt_are_refused(llm: LLM) -> None:
    item = MediaInput("image", "x", {}, 2, 5)
    request = dataclasses.replace(EngineRequest.of("r", [1, 2, 3]), media=(item,))
    with pytest.raises(ValueError, match=r"`media\[0\]`"):
        llm.engine.add_request(request)


def test_chat_reads_a_local_image_path(llm: LLM, tmp_path: Path) -> None:
    path = tmp_path / "wide.png"
    WIDE.save(path)

    def conversation(part: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": [{"type": "text", "text": "see "}, part]}]

    by_path = llm.chat(conversation({"type": "image_url", "image_url": str(path)}), GREEDY)
    by_pil = llm.chat(conversation({"type": "image_pil", "image_pil": WIDE}), GREEDY)
    assert_same(by_path, by_pil)
