"""Media families and LoRA adapters on a GPU: our engine on cuda against transformers (and
peft) on the same GPU, in float32.

Every test is marked ``cuda`` (skipped where torch sees no GPU). Preprocessing is device-free
and checked against transformers' processors on the CPU (test_idefics3_engine and its
siblings); here both sides take the processor's inputs and run their models on the GPU:

* each media family (Idefics3 images, Qwen2-VL and Qwen2.5-VL images, Qwen2-Audio clips):
  prompt ids equal transformers' processor's, greedy tokens equal its ``generate``, each
  token's logprob within 1e-3 (the float32 bound of test_cuda_parity); a batch of media and
  text requests equals each request alone;
* LoRA: a batch mixing the base and three adapters equals transformers + peft's greedy tokens
  on the GPU per request (adapters keep decode eager on CUDA: no graphs with adapters).

Transformers' image processors are asked for their Pillow backend (``backend="pil"``), the
one ours reproduces; with torchvision installed, as on GPU images, its default is the other.
cuDNN's TF32 convolutions are switched off, so the patch embeddings are float32 on both sides.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from lora_support import PROMPTS as LORA_PROMPTS
from parity_support import hf_greedy_media, logprobs_of, tokens
from PIL import Image

from ferrollm import LLM, SamplingParams
from ferrollm.engine import RequestOutput
from ferrollm.lora.request import LoRARequest
from tiny_lora import THREE_ADAPTERS, make_adapter, peft_greedy
from tiny_models import build_tiny_model

pytestmark = pytest.mark.cuda

DEVICE = "cuda"
NUM_NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=0)
GREEDY_TOKENS = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
#: float32 on both sides, on one GPU: as test_cuda_parity.
LOGPROB_TOLERANCE = 1e-3
#: An explicit KV budget (the GPU's default takes 90% of free memory, leaving none for the
#: oracle) and a step budget that chunks the prompts through their media.
ENGINE: dict[str, Any] = {
    "dtype": "float32",
    "kv_cache_memory": "64MiB",
    "max_num_seqs": 8,
    "max_num_batched_tokens": 64,
}
AUDIO_RATE = 16_000


@pytest.fixture(autouse=True, scope="module")
def _no_tf32() -> Iterator[None]:
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def noise(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def tone(seconds: float, hz: float) -> npt.NDArray[np.float32]:
    t = np.arange(round(seconds * AUDIO_RATE)) / AUDIO_RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def oracle(model_class: str, directory: Path, *, processor: bool = True) -> tuple[Any, Any]:
    """transformers' float32 model of ``directory`` on the GPU (no end token: as
    ignore_eos) and (unless not ``processor``) its processor, with the Pillow image backend
    where it has images."""
    import transformers

    model = getattr(transformers, model_class).from_pretrained(directory, dtype=torch.float32)
    model = model.to(DEVICE).eval()
    model.generation_config.eos_token_id = None
    kwargs = {} if model_class.startswith("Qwen2Audio") else {"backend": "pil"}
    if not processor:
        return model, None
    return model, transformers.AutoProcessor.from_pretrained(directory, **kwargs)


def assert_equals_oracle(output: RequestOutput, model: Any, inputs: Any) -> None:
    inputs = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    assert output.prompt_token_ids == inputs["input_ids"][0].tolist()
    want_tokens, want_logprobs = hf_greedy_media(model, inputs, NUM_NEW_TOKENS)
    assert tokens(output) == want_tokens
    np.testing.assert_allclose(logprobs_of(output), want_logprobs, atol=LOGPROB_TOLERANCE)


def assert_batch_equals_alone(llm: LLM, prompts: list[Any]) -> None:
    batch = llm.generate(prompts, GREEDY)
    for prompt, together in zip(prompts, batch, strict=True):
        alone = llm.generate(prompt, GREEDY)[0]
        assert tokens(together) == tokens(alone)
        np.testing.assert_allclose(
            logprobs_of(together), logprobs_of(alone), atol=LOGPROB_TOLERANCE
        )


IDEFICS3_CASES = {
    "one-image": ("User: what is in <image> this picture?", [noise(90, 200, 1)]),
    "two-images": (
        "User: compare <image> and <image>, please.",
        [noise(30, 50, 2), noise(200, 90, 3)],
    ),
    "text-only": ("User: describe a red square.", []),
}


def test_idefics3_on_the_gpu_equals_transformers(tiny_idefics3_dir: Path) -> None:
    model, processor = oracle("Idefics3ForConditionalGeneration", tiny_idefics3_dir)
    llm = LLM(tiny_idefics3_dir, device=DEVICE, **ENGINE)
    prompts: list[Any] = []
    for prompt, images in IDEFICS3_CASES.values():
        if images:
            inputs = processor(text=prompt, images=[images], return_tensors="pt")
            prompts.append({"prompt": prompt, "multi_modal_data": {"image": images}})
        else:
            inputs = processor.tokenizer(prompt, return_tensors="pt")
            prompts.append(prompt)
        assert_equals_oracle(llm.generate(prompts[-1], GREEDY)[0], model, inputs)
    assert_batch_equals_alone(llm, prompts)


QWEN2_VL_CASES = {
    "one-image": ["<|vision_start|><|image_pad|><|vision_end|>what is this?"],
    "two-images": [
        "<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|><|vision_end|>"
        "compare them?"
    ],
    "text-only": ["describe a red square?"],
}
QWEN2_VL_IMAGES = {
    "one-image": [noise(60, 150, 1)],
    "two-images": [noise(30, 40, 2), noise(200, 90, 3)],
    "text-only": [],
}


def _qwen2_vl_chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def _qwen2_vl_inputs(directory: Path, prompt: str, images: list[Image.Image]) -> dict[str, Any]:
    """transformers' Pillow image processor's pixels and grids, each image pad repeated once
    per merged patch as its processor does, and the token types ``generate`` reads."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    extra: dict[str, Any] = {}
    if images:
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(directory)
        out = image_processor(images=images, return_tensors="pt")
        extra = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        merge = image_processor.merge_size**2
        for t, h, w in out["image_grid_thw"].tolist():
            prompt = prompt.replace("<|image_pad|>", "<|placeholder|>" * (t * h * w // merge), 1)
        prompt = prompt.replace("<|placeholder|>", "<|image_pad|>")
    ids = tokenizer([prompt], return_tensors="pt")
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    types = (ids["input_ids"] == image_pad).long()
    return {**ids, **extra, "mm_token_type_ids": types}


@pytest.mark.parametrize(
    ("family", "model_class"),
    [
        ("tiny_qwen2_vl_dir", "Qwen2VLForConditionalGeneration"),
        ("tiny_qwen2_5_vl_dir", "Qwen2_5_VLForConditionalGeneration"),
    ],
    ids=["qwen2-vl", "qwen2.5-vl"],
)
def test_qwen_vl_on_the_gpu_equals_transformers(
    family: str, model_class: str, request: pytest.FixtureRequest
) -> None:
    directory: Path = request.getfixturevalue(family)
    model, _ = oracle(model_class, directory, processor=False)
    llm = LLM(directory, device=DEVICE, **ENGINE)
    prompts: list[Any] = []
    for case, (text,) in QWEN2_VL_CASES.items():
        prompt, images = _qwen2_vl_chat(text), QWEN2_VL_IMAGES[case]
        inputs = _qwen2_vl_inputs(directory, prompt, images)
        prompts.append(
            {"prompt": prompt, "multi_modal_data": {"image": images}} if images else prompt
        )
        assert_equals_oracle(llm.generate(prompts[-1], GREEDY)[0], model, inputs)
    assert_batch_equals_alone(llm, prompts)


AUDIO_ONE = (
    "<|im_start|>user\nAudio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\nwhat is it?<|im_end|>\n"
)
AUDIO_TWO = (
    "<|im_start|>user\nAudio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "Audio 2: <|audio_bos|><|AUDIO|><|audio_eos|>\ncompare<|im_end|>\n"
)


def test_qwen2_audio_on_the_gpu_equals_transformers(tiny_qwen2_audio_dir: Path) -> None:
    model, processor = oracle("Qwen2AudioForConditionalGeneration", tiny_qwen2_audio_dir)
    llm = LLM(tiny_qwen2_audio_dir, device=DEVICE, **ENGINE)
    prompts: list[Any] = []
    for prompt, clips in (
        (AUDIO_ONE, [tone(1.3, 440.0)]),
        (AUDIO_TWO, [tone(0.6, 220.0), tone(1.0, 330.0)]),
    ):
        inputs = processor(
            text=[prompt], audio=clips, sampling_rate=AUDIO_RATE, return_tensors="pt"
        )
        prompts.append(
            {"prompt": prompt, "multi_modal_data": {"audio": [(c, AUDIO_RATE) for c in clips]}}
        )
        assert_equals_oracle(llm.generate(prompts[-1], GREEDY)[0], model, dict(inputs))
    assert_batch_equals_alone(llm, prompts)


def test_lora_adapters_on_the_gpu_equal_peft(tmp_path: Path) -> None:
    base = build_tiny_model("qwen2", tmp_path / "base")
    adapters = {
        name: make_adapter(base, tmp_path / name, seed, **config)
        for seed, (name, config) in enumerate(THREE_ADAPTERS.items(), start=1)
    }
    llm = LLM(
        base,
        device=DEVICE,
        enable_lora=True,
        max_loras=3,
        lora_modules=[f"{name}={path}" for name, path in adapters.items()],
        **ENGINE,
    )
    names: list[str | None] = [None, "qv8", "mlp4", "all16"]
    requests = [None if n is None else LoRARequest(n) for n in names]
    batch = llm.generate(list(LORA_PROMPTS), GREEDY_TOKENS, requests)
    for prompt, name, out in zip(LORA_PROMPTS, names, batch, strict=True):
        adapter = None if name is None else adapters[name]
        want = peft_greedy(base, adapter, prompt, NUM_NEW_TOKENS, DEVICE)
        assert out.outputs[0].token_ids == want, name
    # The adapters change the model (so the comparison above means something).
    on_adapter = llm.generate([LORA_PROMPTS[0]], GREEDY_TOKENS, LoRARequest("all16"))
    assert on_adapter[0].outputs[0].token_ids != batch[0].outputs[0].token_ids
