"""Qwen2-Audio served by the engine, against transformers on the tiny checkpoint.

The oracle is ``Qwen2AudioForConditionalGeneration.generate`` (greedy, float32) on
``Qwen2AudioProcessor``'s outputs for the same prompt and clips, and transformers' own
feature extractor and audio tower for the parts. Our side: the checkpoint's Qwen2 decoder
through the engine, the clips through our processor and audio tower, their features spliced
at the ``<|AUDIO|>`` tokens. Also: a mixed batch, the offline generate and chat shapes, and
refusals.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import wave
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
import transformers
from parity_support import MEDIA_LOGPROB_TOLERANCE as LOGPROB_TOLERANCE
from parity_support import busy_media_options, hf_greedy_media, logprobs_of, tokens

from ferrollm import LLM, SamplingParams
from ferrollm.engine import RequestOutput
from ferrollm.media.items import AudioMedia
from ferrollm.media.loader import load_media_sync
from ferrollm.media.options import MediaPolicy
from ferrollm.media.parts import parse_media_part
from ferrollm.models.audio import load_qwen2_audio_tower
from ferrollm.models.audio.log_mel import LogMel, LogMelSettings, mel_filter_bank
from ferrollm.multimodal.qwen2_audio import Qwen2AudioProcessor

NUM_NEW_TOKENS = 6
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=0)
RATE = 16_000
#: Chunks of 8 tokens (every clip's run is cut), 4 seats and a KV cache of 24 blocks of 4
#: tokens (2 KiB each), too small for the clip prompts at once: preemption.
BUSY = busy_media_options(24)


def tone(seconds: float, hz: float, amplitude: float = 0.5) -> npt.NDArray[np.float32]:
    """A sine clip at 16 kHz."""
    t = np.arange(round(seconds * RATE)) / RATE
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


A = tone(1.3, 440.0)  # 32 audio tokens
B = tone(0.6, 220.0, 0.3)  # 15 tokens
ONE_CLIP = "<|im_start|>user\nAudio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\nwhat is it?<|im_end|>\n"
TWO_CLIPS = (
    "<|im_start|>user\nAudio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "Audio 2: <|audio_bos|><|AUDIO|><|audio_eos|>\ncompare<|im_end|>\n"
)
TEXT_ONLY = "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"


def wav_bytes(samples: npt.NDArray[np.float32], rate: int = RATE) -> bytes:
    """16-bit PCM WAV of ``samples``."""
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def decoded(samples: npt.NDArray[np.float32]) -> AudioMedia:
    """``samples`` through a WAV data URI and the media loader, as the intake reads a part."""
    url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(samples)).decode()
    part = parse_media_part({"type": "audio_url", "audio_url": {"url": url}}, "part")
    item = load_media_sync(part, MediaPolicy.create(), sample_rate=RATE)
    assert isinstance(item, AudioMedia)
    return item


@dataclasses.dataclass
class Reference:
    """transformers' processor and model over the tiny checkpoint."""

    processor: Any
    model: Any

    def inputs(self, prompt: str, clips: list[npt.NDArray[np.float32]]) -> Any:
        if clips:
            return self.processor(
                text=[prompt], audio=clips, sampling_rate=RATE, return_tensors="pt"
            )
        return self.processor.tokenizer([prompt], return_tensors="pt")

    def greedy(
        self, prompt: str, clips: list[npt.NDArray[np.float32]]
    ) -> tuple[list[int], list[float]]:
        """Greedy tokens and each one's logprob."""
        inputs = self.inputs(prompt, clips)
        return hf_greedy_media(self.model, inputs, NUM_NEW_TOKENS)


@pytest.fixture(scope="module")
def reference(tiny_qwen2_audio_dir: Path) -> Reference:
    model = transformers.Qwen2AudioForConditionalGeneration.from_pretrained(
        tiny_qwen2_audio_dir, dtype=torch.float32
    ).eval()
    model.generation_config.eos_token_id = None  # as ignore_eos: always NUM_NEW_TOKENS
    processor = transformers.AutoProcessor.from_pretrained(tiny_qwen2_audio_dir)
    return Reference(processor, model)


@pytest.fixture(scope="module")
def llm(tiny_qwen2_audio_dir: Path) -> LLM:
    return LLM(tiny_qwen2_audio_dir, device="cpu", dtype="float32")


def mm(prompt: str, *clips: npt.NDArray[np.float32]) -> dict[str, Any]:
    return {"prompt": prompt, "multi_modal_data": {"audio": [(c, RATE) for c in clips]}}


def assert_matches(output: RequestOutput, want: tuple[list[int], list[float]]) -> None:
    assert tokens(output) == want[0]
    np.testing.assert_allclose(logprobs_of(output), want[1], atol=LOGPROB_TOLERANCE)


# --- parts: features, token counts, the audio tower ---------------------------------------


@pytest.mark.parametrize("seconds", [0.05, 1.3, 35.0])
def test_features_equal_transformers_feature_extractor(
    llm: LLM, reference: Reference, seconds: float
) -> None:
    """A WAV clip read by the intake, then our processor: the features and frame mask equal
    transformers' processor's on the same samples (a 50 ms clip, a typical one, and one past
    the 30 s window, which both cut)."""
    item = decoded(tone(seconds, 330.0))
    processor = llm.engine.multimodal
    assert isinstance(processor, Qwen2AudioProcessor)
    ours, mask = processor.features(item)
    theirs = reference.processor(
        text=["<|AUDIO|>"], audio=[item.samples], sampling_rate=RATE, return_tensors="pt"
    )
    assert tuple(ours.shape) == (80, 3000)
    torch.testing.assert_close(ours, theirs["input_features"][0], rtol=0, atol=1e-6)
    assert torch.equal(mask.long(), theirs["feature_attention_mask"][0].long())


def test_log_mel_at_128_channels_equals_transformers(tmp_path: Path) -> None:
    """Qwen2-Audio's own 128 channels, settings read from a ``preprocessor_config.json`` (as
    the released checkpoints hold them), on a noisy 7.77 s clip and a bit: the filter bank, features
    and mask equal ``WhisperFeatureExtractor``'s."""
    extractor = transformers.WhisperFeatureExtractor(feature_size=128)
    extractor.save_pretrained(tmp_path)
    settings = LogMelSettings.from_directory(tmp_path)
    assert settings.feature_size == 128 and settings.num_frames == 3000
    np.testing.assert_allclose(mel_filter_bank(settings), extractor.mel_filters, rtol=0, atol=1e-8)
    rng = np.random.default_rng(0)
    n = round(7.77 * RATE) + 37  # not a whole number of 10 ms frames: the mask rounds up
    clip = tone(n / RATE, 440.0) + (0.05 * rng.standard_normal(n)).astype(np.float32)
    ours, mask = LogMel(settings)(clip)
    theirs = extractor(
        clip,
        sampling_rate=RATE,
        return_attention_mask=True,
        padding="max_length",
        return_tensors="pt",
    )
    torch.testing.assert_close(ours, theirs["input_features"][0], rtol=0, atol=1e-6)
    assert torch.equal(mask.long(), theirs["attention_mask"][0].long())
    assert int(mask.sum()) == 778


@pytest.mark.parametrize(("prompt", "clips"), [(ONE_CLIP, [A]), (TWO_CLIPS, [A, B])])
def test_token_ids_equal_transformers_processor(
    llm: LLM, reference: Reference, prompt: str, clips: list[npt.NDArray[np.float32]]
) -> None:
    """The expanded prompt's ids equal transformers' processor's; each clip's span is its
    run of ``<|AUDIO|>`` tokens."""
    processor = llm.engine.multimodal
    assert processor is not None
    done = processor.process(prompt, [AudioMedia(c, RATE, "pcm") for c in clips])
    want = reference.inputs(prompt, clips)["input_ids"][0].tolist()
    assert done.prompt_token_ids == want
    audio_id = reference.processor.audio_token_id
    assert [m.length for m in done.media] == [32, 15][: len(clips)]
    for item in done.media:
        span = want[item.offset : item.offset + item.length]
        assert set(span) == {audio_id}
        assert want[item.offset - 1] != audio_id and want[item.offset + item.length] != audio_id


def test_audio_tower_equals_transformers(tiny_qwen2_audio_dir: Path, reference: Reference) -> None:
    """Our tower (layers over the kept positions only) equals transformers' over all 1,500
    positions with padding keys masked, for clips of different lengths in one batch."""
    fe = reference.processor.feature_extractor
    batch = fe(
        [A, B, tone(31.0, 100.0)],
        sampling_rate=RATE,
        return_attention_mask=True,
        padding="max_length",
        return_tensors="pt",
    )
    features, mask = batch["input_features"], batch["attention_mask"]
    ours = load_qwen2_audio_tower(tiny_qwen2_audio_dir).audio_features(features, mask)
    model = reference.model.model
    from transformers.masking_utils import create_bidirectional_mask

    lengths, counts = model.audio_tower._get_feat_extract_output_lengths(mask.sum(-1))
    keys = (torch.arange(1500)[None, :] < lengths[:, None]).long()
    attention = create_bidirectional_mask(
        config=model.audio_tower.config,
        inputs_embeds=torch.zeros(3, 1500, 1),
        attention_mask=keys,
    )
    with torch.no_grad():
        hidden = model.audio_tower(features, attention_mask=attention).last_hidden_state
        theirs = model.multi_modal_projector(hidden)
    assert [len(o) for o in ours] == counts.tolist() == [32, 15, 750]
    for i, out in enumerate(ours):
        torch.testing.assert_close(out, theirs[i, : counts[i]], rtol=0, atol=1e-5)


# --- generation against transformers --------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "clips"),
    [(ONE_CLIP, [A]), (TWO_CLIPS, [A, B]), (TEXT_ONLY, [])],
    ids=["one-clip", "two-clips", "text-only"],
)
def test_greedy_equals_transformers(
    llm: LLM, reference: Reference, prompt: str, clips: list[npt.NDArray[np.float32]]
) -> None:
    """Greedy tokens equal transformers' generate token for token, logprobs to 1e-4."""
    want = reference.greedy(prompt, clips)
    request: Any = mm(prompt, *clips) if clips else prompt
    (got,) = llm.generate([request], GREEDY)
    assert_matches(got, want)


def test_mixed_batch_equals_each_alone(llm: LLM) -> None:
    """Clip prompts and a text prompt in one batch give what each gives alone."""
    prompts: list[Any] = [mm(ONE_CLIP, A), TEXT_ONLY, mm(TWO_CLIPS, B, A), mm(ONE_CLIP, B)]
    together = llm.generate(prompts, GREEDY)
    for prompt, got in zip(prompts, together, strict=True):
        (alone,) = llm.generate([prompt], GREEDY)
        assert tokens(got) == tokens(alone)
        np.testing.assert_allclose(logprobs_of(got), logprobs_of(alone), atol=LOGPROB_TOLERANCE)


def test_chunked_prefill_and_preemption_through_clips(tiny_qwen2_audio_dir: Path, llm: LLM) -> None:
    """Chunks that cut through clip spans, and recomputes after preemption, give what each
    prompt gives alone in one chunk."""
    prompts: list[Any] = [mm(ONE_CLIP, A), mm(TWO_CLIPS, A, B), TEXT_ONLY, mm(ONE_CLIP, B)]
    alone = [llm.generate([p], GREEDY)[0] for p in prompts]
    busy = LLM(tiny_qwen2_audio_dir, device="cpu", **BUSY)
    for got, want in zip(busy.generate(prompts, GREEDY), alone, strict=True):
        assert tokens(got) == tokens(want)
        np.testing.assert_allclose(logprobs_of(got), logprobs_of(want), atol=LOGPROB_TOLERANCE)
    assert busy.engine.scheduler.stats()["num_preemptions"] > 0


def test_the_layout_transformers_5_17_saves_loads_the_same(
    tiny_qwen2_audio_dir: Path, llm: LLM, tmp_path: Path
) -> None:
    """transformers 5.17 saves the decoder as ``language_model.model.model.*`` (found on a
    GPU machine whose image has it): the same weights under those names give the same
    outputs."""
    import shutil

    from safetensors.torch import load_file, save_file

    for item in tiny_qwen2_audio_dir.iterdir():
        if item.name != "model.safetensors":
            shutil.copy(item, tmp_path / item.name)
    tensors = load_file(tiny_qwen2_audio_dir / "model.safetensors")
    renamed = {
        k.replace("language_model.model.", "language_model.model.model.", 1): v
        for k, v in tensors.items()
    }
    assert any(k.startswith("language_model.model.model.") for k in renamed)
    save_file(renamed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    deeper = LLM(tmp_path, device="cpu", dtype="float32")
    prompt = mm(ONE_CLIP, A)
    assert_matches(deeper.generate(prompt, GREEDY)[0], tuple_of(llm.generate(prompt, GREEDY)[0]))


def tuple_of(output: RequestOutput) -> tuple[list[int], list[float]]:
    return tokens(output), logprobs_of(output)


def test_a_repeated_clip_is_encoded_once(tiny_qwen2_audio_dir: Path) -> None:
    """The encoder cache names a clip by its features: the same clip twice in one prompt, in
    two prompts of a batch and in a later prompt is encoded once."""
    fresh = LLM(tiny_qwen2_audio_dir, device="cpu", dtype="float32")
    fresh.generate([mm(TWO_CLIPS, A, A), mm(ONE_CLIP, A)], GREEDY)
    cache = fresh.engine.encoder_cache
    assert cache is not None
    assert cache.misses == 1
    fresh.generate([mm("hello " + ONE_CLIP, A)], GREEDY)  # another prefix: no KV reuse
    assert cache.misses == 1 and cache.hits == 1


def test_dummy_weights_give_a_random_audio_tower(
    tiny_qwen2_audio_dir: Path, tmp_path: Path
) -> None:
    """``load_format`` dummy on a directory without weights builds a random tower too."""
    for name in ("config.json", "processor_config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tiny_qwen2_audio_dir / name).read_bytes())
    llm = LLM(tmp_path, device="cpu", dtype="float32", load_format="dummy")
    (got,) = llm.generate([mm(ONE_CLIP, A)], GREEDY)
    assert len(tokens(got)) == NUM_NEW_TOKENS


def test_clip_at_another_rate_is_resampled(llm: LLM) -> None:
    """vLLM's ``(samples, rate)`` at 8 kHz is resampled to 16 kHz: its features are a 16 kHz
    clip's of the same length (same token count)."""
    slow = tone(1.3, 440.0)[::2]
    done = llm.engine.multimodal
    assert done is not None
    (got,) = llm.generate(
        [{"prompt": ONE_CLIP, "multi_modal_data": {"audio": (slow, 8000)}}], GREEDY
    )
    assert len(got.prompt_token_ids) == len(
        done.process(ONE_CLIP, [AudioMedia(A, RATE, "pcm")]).prompt_token_ids
    )


def test_chat_with_audio_url_equals_generate(llm: LLM, reference: Reference) -> None:
    """``LLM.chat`` with an ``audio_url`` WAV data URI renders the conversation as
    transformers' processor does, and generates what transformers does on that prompt and
    the decoded clip."""
    url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(A)).decode()
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "audio_url", "audio_url": {"url": url}},
                {"type": "text", "text": "what is it?"},
            ],
        }
    ]
    (got,) = llm.chat(messages, GREEDY)
    # The model's own template writes the clip's marker ("Audio 1: ..."), as transformers'
    # processor renders the same conversation with the part as its docs show it.
    theirs = [
        {**messages[0], "content": [{"type": "audio", "audio_url": url}, messages[0]["content"][1]]}
    ]
    rendered = reference.processor.apply_chat_template(
        theirs, tokenize=False, add_generation_prompt=True
    )
    assert "Audio 1: <|audio_bos|><|AUDIO|><|audio_eos|>" in rendered
    assert got.prompt == rendered
    assert_matches(got, reference.greedy(rendered, [decoded(A).samples]))


# --- refusals --------------------------------------------------------------------------------


def test_refusals(llm: LLM) -> None:
    """Wrong counts, an image, and a clip too short for one token name the item."""
    processor = llm.engine.multimodal
    assert processor is not None
    assert processor.modalities == frozenset({"audio"})
    clip = AudioMedia(A, RATE, "pcm")
    with pytest.raises(ValueError, match=r"media\[1\].*1 <\|AUDIO\|> placeholders for 2"):
        processor.process(ONE_CLIP, [clip, clip])
    with pytest.raises(ValueError, match=r"media\[0\].*too short"):
        processor.process(ONE_CLIP, [AudioMedia(A[:200], RATE, "pcm")])
    with pytest.raises(ValueError, match=r"media\[0\].*8000 Hz"):
        processor.process(ONE_CLIP, [AudioMedia(A, 8000, "pcm")])
    with pytest.raises(ValueError, match="audio only"):
        processor.placeholder("image")
