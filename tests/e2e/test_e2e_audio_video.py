"""Audio and video over the wire: ``ferrollm serve`` on the tiny Qwen2-Audio and Qwen2-VL
checkpoints (random weights, built here) as real processes, driven by the official ``openai``
SDK.

A clip (``audio_url``) and a video (``video_url``), each sent as a data URI and as a local path
under ``--allowed-local-media-path``, answer as the offline ``LLM.chat`` on the same model
(itself checked against transformers in tests/engine/test_qwen2_audio_engine.py and
test_qwen2_vl_engine.py), streamed or not; ``usage.prompt_tokens`` counts the media's tokens.
A repeated clip is encoded once (``/metrics``' encoder-cache counters). A corrupt clip or
video, a part of a kind the model does not take, and a path outside the root are 400s naming
the part, and the server answers the next request.
"""

from __future__ import annotations

import io
import re
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from ferrollm import LLM, SamplingParams
from tiny_models import build_tiny_qwen2_audio, build_tiny_qwen2_vl

from .e2e_support import Server, data_uri, media_chat, media_part, serving

MAX_TOKENS = 6
RATE = 16_000
QUESTION = "what is it?"


def wav(seconds: float, hz: float) -> bytes:
    t = np.arange(round(seconds * RATE)) / RATE
    samples = (0.5 * np.sin(2 * np.pi * hz * t) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(RATE)
        f.writeframes(samples.tobytes())
    return out.getvalue()


def mp4(num_frames: int, size: int) -> bytes:
    """An mpeg4 clip of ``num_frames`` flat frames of ``size`` x ``size`` pixels."""
    import av

    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as file:
        stream = file.add_stream("mpeg4", rate=4)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(num_frames):
            pixels = np.full((size, size, 3), 30 * i, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                file.mux(packet)
        for packet in stream.encode():
            file.mux(packet)
    return out.getvalue()


CLIP = wav(1.3, 440.0)
VIDEO = mp4(6, 32)


part = media_part


def chat(*parts: dict[str, Any]) -> list[Any]:
    return media_chat(QUESTION, *parts)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The servers' ``--allowed-local-media-path``, holding the clip and the video."""
    root = tmp_path_factory.mktemp("media-root")
    (root / "clip.wav").write_bytes(CLIP)
    (root / "clip.mp4").write_bytes(VIDEO)
    return root


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("media-models")
    return {
        "audio": build_tiny_qwen2_audio(base / "qwen2-audio"),
        "video": build_tiny_qwen2_vl(base / "qwen2-vl"),
    }


@pytest.fixture(scope="module", params=["audio", "video"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def server(
    kind: str, models: dict[str, Path], root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    with serving(
        tmp_path_factory.mktemp(f"{kind}-server"),
        str(models[kind]),
        "--served-model-name",
        kind,
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--allowed-local-media-path",
        str(root),
    ) as server:
        yield server


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


#: Per model: its media part's type, the sample's MIME type and file name.
MEDIA = {
    "audio": ("audio_url", "audio/wav", "clip.wav", CLIP),
    "video": ("video_url", "video/mp4", "clip.mp4", VIDEO),
}


@pytest.fixture(scope="module")
def offline(kind: str, models: dict[str, Path], server: Server) -> Any:
    """The offline engine's greedy answer to the sample (loaded once the server is up)."""
    part_type, mime, _, data = MEDIA[kind]
    llm = LLM(models[kind], device="cpu", dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    return llm.chat(chat(part(part_type, data_uri(data, mime))), params)[0]


def ask(client: openai.OpenAI, kind: str, *parts: dict[str, Any], **extra: Any) -> Any:
    return client.chat.completions.create(
        model=kind, messages=chat(*parts), max_tokens=MAX_TOKENS, temperature=0, **extra
    )


def test_the_card_lists_the_modalities(client: openai.OpenAI, kind: str) -> None:
    (card,) = client.models.list().data
    want = ["text", "audio"] if kind == "audio" else ["text", "image", "video"]
    assert card.model_extra is not None and card.model_extra["modalities"] == want


def test_data_uri_and_local_path_answer_as_the_offline_engine(
    client: openai.OpenAI, kind: str, root: Path, offline: Any
) -> None:
    part_type, mime, name, data = MEDIA[kind]
    for url in (data_uri(data, mime), str(root / name)):
        response = ask(client, kind, part(part_type, url))
        assert response.choices[0].message.content == offline.outputs[0].text, url[:40]
        assert response.usage is not None
        assert response.usage.prompt_tokens == len(offline.prompt_token_ids)
        assert response.usage.completion_tokens == len(offline.outputs[0].token_ids)
    # The media's tokens are counted: far more prompt tokens than the text alone has.
    text_only = ask(client, kind)
    assert text_only.usage is not None
    assert len(offline.prompt_token_ids) >= text_only.usage.prompt_tokens + 12


def test_streamed_equals_whole(client: openai.OpenAI, kind: str, offline: Any) -> None:
    part_type, mime, _, data = MEDIA[kind]
    chunks = list(
        ask(
            client,
            kind,
            part(part_type, data_uri(data, mime)),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        offline.outputs[0].text
    )
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == len(offline.prompt_token_ids)


def metric(server: Server, name: str) -> float:
    text = server.http.get("/metrics").text
    match = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} not in /metrics"
    return float(match[1])


def test_a_repeated_sample_is_encoded_once(
    client: openai.OpenAI, server: Server, kind: str
) -> None:
    """The same sample after other text: its blocks are not in the prefix cache (their text
    before differs), so its tokens are computed again, from the encoder cache."""
    part_type, mime, _, data = MEDIA[kind]
    url = data_uri(data, mime)
    ask(client, kind, part(part_type, url))  # encoded now, or earlier by another test
    misses = metric(server, "ferrollm_encoder_cache_misses_total")
    hits = metric(server, "ferrollm_encoder_cache_hits_total")
    preamble = {"type": "text", "text": "Listen or look closely. "}
    ask(client, kind, preamble, part(part_type, url))
    assert metric(server, "ferrollm_encoder_cache_misses_total") == misses
    assert metric(server, "ferrollm_encoder_cache_hits_total") > hits
    assert metric(server, "ferrollm_encoder_cache_bytes") > 0
    assert metric(server, "ferrollm_encoder_cache_entries") >= 1


def test_bad_media_is_a_400_naming_the_part(
    client: openai.OpenAI, kind: str, tmp_path: Path
) -> None:
    part_type, mime, _, data = MEDIA[kind]
    outside = tmp_path / MEDIA[kind][2]
    outside.write_bytes(data)
    other = "image_url" if kind == "audio" else "audio_url"
    bad = {
        "corrupt": (part(part_type, data_uri(data[: len(data) // 8], mime)), "invalid_media"),
        "empty": (part(part_type, data_uri(b"", mime)), "invalid_media"),
        "outside-the-root": (part(part_type, str(outside)), "media_path_not_allowed"),
        "kind-not-taken": (
            part(other, data_uri(b"x", "image/png" if kind == "audio" else "audio/wav")),
            "unsupported_content_type",
        ),
    }
    for name, (bad_part, code) in bad.items():
        with pytest.raises(openai.BadRequestError) as caught:
            ask(client, kind, bad_part)
        assert caught.value.code == code, (name, caught.value.message)
        assert caught.value.param == "messages[0].content[0]" or (
            caught.value.param or ""
        ).startswith("messages[0].content[0]."), (name, caught.value.param)
    response = ask(client, kind, part(part_type, data_uri(data, mime)))
    assert response.choices[0].finish_reason == "length"


def test_start_up_steps_are_logged(server: Server, kind: str) -> None:
    """Off a terminal, each long start-up step is plain log lines with its time."""
    log = server.log()
    family = "qwen2_audio" if kind == "audio" else "qwen2_vl"
    for line in (
        f"Loading the {family} media encoder: done in ",
        "Loading weights: ",
        "Profiling a step to size the KV cache: done in ",
        "Allocating the KV cache (",
        "Preparing decode steps (compiled graphs where they apply): done in ",
    ):
        assert line in log, line
