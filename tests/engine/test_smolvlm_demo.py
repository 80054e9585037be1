"""The SmolVLM demo checkpoint (`ferrollm.multimodal.demo`): transformers loads it as it is,
our engine's greedy tokens on an image equal transformers', and its text side is the default
model's.

What holds by construction, and is checked here: the decoder's weights are the GGUF's
dequantized bit for bit, SmolLM2's text tokens keep their ids (the image tokens are appended),
so a text-only prompt gets the same ids and the same logits over SmolLM2's vocabulary. The
added tokens' random rows add logits the plain model has not: greedy tokens stay the same as
long as none of those outscores the winner, which holds for the prompt here (their rows are
scaled below the real rows'), not for every prompt.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import tokenizers
import torch
import transformers
from PIL import Image

from ferrollm import LLM, SamplingParams
from ferrollm.executor.loader_gguf import GGUFCheckpoint
from ferrollm.media.items import ImageMedia
from ferrollm.multimodal.demo import ADDED_TOKENS, IMAGE_SEQ_LEN, build_smolvlm_demo

NUM_NEW_TOKENS = 6
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
#: 90 x 200: resized to 512 x 230, then a 1 x 2 grid of 256-pixel tiles plus the global tile.
IMAGE = Image.fromarray(
    np.random.default_rng(1).integers(0, 256, (90, 200, 3), dtype=np.uint8), "RGB"
)
IMAGE_CHAT = [
    {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}],
    }
]
TEXT_CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def demo_llm(smolvlm_demo_dir: Path) -> LLM:
    return LLM(smolvlm_demo_dir, device="cpu", dtype="float32")


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_the_same_seed_writes_the_same_bytes(smolvlm_demo_dir: Path, tmp_path: Path) -> None:
    again = build_smolvlm_demo(tmp_path / "again", seed=0)
    assert digests(again) == digests(smolvlm_demo_dir)


def test_text_tokens_keep_their_ids_and_image_tokens_are_appended(
    smolvlm_demo_dir: Path, smollm2_gguf: Path
) -> None:
    ours = transformers.AutoTokenizer.from_pretrained(smolvlm_demo_dir)
    plain = tokenizers.Tokenizer.from_str(GGUFCheckpoint.open(smollm2_gguf).tokenizer_json)
    text = "<|im_start|>user\nWhat is the capital of France? café 12345<|im_end|>\n"
    want = plain.encode(text, add_special_tokens=False).ids
    assert ours(text, add_special_tokens=False)["input_ids"] == want
    assert ours.convert_tokens_to_ids(ADDED_TOKENS) == list(range(49152, 49152 + len(ADDED_TOKENS)))


def test_an_image_chat_equals_transformers(smolvlm_demo_dir: Path, demo_llm: LLM) -> None:
    # Pillow's image processor, as ours: with torchvision present the default would be its.
    processor = transformers.AutoProcessor.from_pretrained(smolvlm_demo_dir, backend="pil")
    model = transformers.Idefics3ForConditionalGeneration.from_pretrained(
        smolvlm_demo_dir, dtype=torch.float32
    ).eval()
    assert model.lm_head.weight is model.model.text_model.embed_tokens.weight  # tied
    prompt = processor.apply_chat_template(IMAGE_CHAT, add_generation_prompt=True)
    inputs = processor(text=prompt, images=[[IMAGE]], return_tensors="pt", add_special_tokens=False)
    assert int((inputs["input_ids"] == model.config.image_token_id).sum()) == 3 * IMAGE_SEQ_LEN
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NUM_NEW_TOKENS, do_sample=False)
    want = out[0, inputs["input_ids"].shape[1] :].tolist()

    got = demo_llm.generate({"prompt": prompt, "multi_modal_data": {"image": [IMAGE]}}, GREEDY)
    assert got[0].prompt_token_ids == inputs["input_ids"][0].tolist()
    assert got[0].outputs[0].token_ids == want
    # The offline chat API renders the same prompt from typed parts.
    chat = demo_llm.chat(
        [{"role": "user", "content": [{"type": "image_pil", "image_pil": IMAGE}, *_text()]}],
        GREEDY,
    )
    assert chat[0].outputs[0].token_ids == want


def _text() -> list[dict[str, str]]:
    return [{"type": "text", "text": "What is in this picture?"}]


def test_a_text_chat_answers_as_the_default_model(demo_llm: LLM, smollm2_gguf: Path) -> None:
    plain = LLM(smollm2_gguf, device="cpu", dtype="float32", quantization="none")
    params = SamplingParams(temperature=0, max_tokens=12)
    want = plain.chat(TEXT_CHAT, params)[0]
    got = demo_llm.chat(TEXT_CHAT, params)[0]
    assert got.prompt_token_ids == want.prompt_token_ids
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    assert "Paris" in got.outputs[0].text


def test_a_shared_system_prompt_before_different_images_hits(
    smolvlm_demo_dir: Path, demo_llm: LLM
) -> None:
    """The prefix cache keys blocks by the images they overlap: a system prompt before the
    image is shared across images, and the image's blocks are not."""
    system = "You describe pictures for a catalogue: plainly, briefly, in one sentence each."
    chat = [{"role": "system", "content": [{"type": "text", "text": system}]}, *IMAGE_CHAT]
    processor = transformers.AutoProcessor.from_pretrained(smolvlm_demo_dir)
    prompt = processor.apply_chat_template(chat, add_generation_prompt=True)
    other = Image.fromarray(
        np.random.default_rng(2).integers(0, 256, (90, 200, 3), dtype=np.uint8), "RGB"
    )
    ours = demo_llm.engine.multimodal
    assert ours is not None
    offset = ours.process(prompt, [ImageMedia(IMAGE, "png", 200, 90)]).media[0].offset
    block_size = 8
    assert offset // block_size >= 2

    llm = LLM(smolvlm_demo_dir, device="cpu", dtype="float32", block_size=block_size)

    def hits() -> int:
        return int(llm.engine.scheduler.stats()["num_prefix_hit_blocks"])

    llm.generate({"prompt": prompt, "multi_modal_data": {"image": [IMAGE]}}, GREEDY)
    before = hits()
    got = llm.generate({"prompt": prompt, "multi_modal_data": {"image": [other]}}, GREEDY)
    assert hits() - before == offset // block_size, "the text blocks, none of the image's"
    alone = demo_llm.generate({"prompt": prompt, "multi_modal_data": {"image": [other]}}, GREEDY)
    assert got[0].outputs[0].token_ids == alone[0].outputs[0].token_ids
