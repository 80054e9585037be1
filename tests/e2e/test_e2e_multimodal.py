"""Images over the wire: ``ferrollm serve`` on the SmolVLM demo checkpoint
(`ferrollm.multimodal.demo`: the real SmolLM2 decoder, a seeded random vision tower) as a real
process, driven by the official ``openai`` SDK and raw MindIE bodies.

The server reads local files under a temporary root and fetches http media from 127.0.0.1 only,
where the test serves the image itself (a loopback http.server). An image sent as a data URI,
as a local path and as an http URL is the same image: one greedy answer, equal to the offline
``LLM.chat`` on the same model (itself checked against transformers in
tests/engine/test_smolvlm_demo.py), streamed or not; ``usage.prompt_tokens`` counts the image's
tokens. Each bad part and each limit is a 400 (413 for a body) naming the part, and the server
answers the next request.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from PIL import Image

from ferrollm import LLM, SamplingParams
from ferrollm.multimodal.demo import IMAGE_SEQ_LEN
from loopback_http import loopback_server

from . import e2e_support
from .e2e_support import Server, media_chat, media_part, serving, sse_payloads

MODEL = "smolvlm-demo"
GENERATE = f"/v2/models/{MODEL}/generate"
GENERATE_STREAM = f"/v2/models/{MODEL}/generate_stream"
MAX_TOKENS = 8
QUESTION = "What is in this picture?"


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


#: 90 x 200 noise: a 1 x 2 grid of tiles plus the global tile (3 x IMAGE_SEQ_LEN tokens).
PICTURE = png(
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (90, 200, 3), dtype=np.uint8))
)
#: A small image, for the requests that only check the server still answers.
SMALL = png(Image.new("RGB", (8, 8), (200, 30, 30)))


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return e2e_support.data_uri(data, mime)


def image_part(url: str) -> dict[str, Any]:
    return media_part("image_url", url)


def chat(*parts: dict[str, Any]) -> list[Any]:
    return media_chat(QUESTION, *parts)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's ``--allowed-local-media-path``, holding the picture."""
    root = tmp_path_factory.mktemp("media-root")
    (root / "picture.png").write_bytes(PICTURE)
    return root


@pytest.fixture(scope="module")
def loopback() -> Iterator[tuple[int, list[str]]]:
    """A loopback http.server with the picture at /picture.png: its port and the paths
    asked."""
    with loopback_server({"/picture.png": PICTURE}) as served:
        yield served


@pytest.fixture(scope="module")
def web(loopback: tuple[int, list[str]]) -> int:
    return loopback[0]


@pytest.fixture(scope="module")
def server(smolvlm_demo_dir: Path, root: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    with serving(
        tmp_path_factory.mktemp("smolvlm-server"),
        str(smolvlm_demo_dir),
        "--served-model-name",
        MODEL,
        "--allowed-local-media-path",
        str(root),
        "--allowed-media-domains",
        "127.0.0.1",
    ) as server:
        yield server


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def offline(smolvlm_demo_dir: Path, server: Server) -> Any:
    """The offline engine's greedy answer to the picture (loaded after the server is up, so
    the two loads do not compete for the CPUs)."""
    llm = LLM(smolvlm_demo_dir, device="cpu", dtype="float32", max_model_len=2048)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    output = llm.chat(chat(image_part(data_uri(PICTURE))), params)[0]
    return llm, output


def ask(client: openai.OpenAI, *parts: dict[str, Any], **extra: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=chat(*parts), max_tokens=MAX_TOKENS, temperature=0, **extra
    )


def test_the_card_lists_images(client: openai.OpenAI) -> None:
    (card,) = client.models.list().data
    assert card.id == MODEL
    assert card.model_extra is not None and card.model_extra["modalities"] == ["text", "image"]


def test_data_uri_local_path_and_http_url_answer_as_the_offline_engine(
    client: openai.OpenAI, root: Path, web: int, offline: Any
) -> None:
    _, want = offline
    sources = {
        "data-uri": data_uri(PICTURE),
        "local-path": str(root / "picture.png"),
        "file-url": (root / "picture.png").as_uri(),
        "http-url": f"http://127.0.0.1:{web}/picture.png",
    }
    for name, url in sources.items():
        response = ask(client, image_part(url))
        assert response.choices[0].message.content == want.outputs[0].text, name
        assert response.usage is not None
        assert response.usage.prompt_tokens == len(want.prompt_token_ids), name
        assert response.usage.completion_tokens == len(want.outputs[0].token_ids), name
    # The image's three tiles stand as their tokens in the prompt the server counted.
    image_token_id = 49152 + 1
    assert want.prompt_token_ids.count(image_token_id) == 3 * IMAGE_SEQ_LEN


def test_streamed_equals_whole(client: openai.OpenAI, offline: Any) -> None:
    _, want = offline
    chunks = list(
        ask(
            client,
            image_part(data_uri(PICTURE)),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.outputs[0].text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == len(want.prompt_token_ids)


def mindie_body(*parts: Any, max_new_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    return {
        "text_input": list(parts),
        "parameters": {"max_new_tokens": max_new_tokens, "do_sample": False},
    }


@pytest.mark.parametrize("bare", [True, False], ids=["bare-string", "object"])
def test_mindie_generate_and_stream(server: Server, offline: Any, root: Path, bare: bool) -> None:
    llm, _ = offline
    path = str(root / "picture.png")
    part = {"type": "image_url", "image_url": path if bare else {"url": path}}
    body = mindie_body({"type": "text", "text": "Describe "}, part)
    # MindIE applies no template: the parts joined, the placeholder where the image stood.
    image = Image.open(io.BytesIO(PICTURE))
    want = llm.generate(
        {"prompt": "Describe <image>", "multi_modal_data": {"image": [image]}},
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
    )[0]
    whole = server.http.post(GENERATE, json=body)
    assert whole.status_code == 200, whole.text
    assert whole.json()["text_output"] == want.outputs[0].text
    stream = server.http.post(GENERATE_STREAM, json=body)
    assert stream.status_code == 200, stream.text
    frames = [json.loads(p) for p in sse_payloads(stream.content)]
    assert "".join(f["text_output"] for f in frames) == want.outputs[0].text
    assert frames[-1]["details"]["generated_tokens"] == len(want.outputs[0].token_ids)


@pytest.fixture(scope="module")
def bad_parts(
    root: Path, web: int, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Any, str]]:
    """name -> (the part, the error code); the files they name written once."""
    outside = tmp_path_factory.mktemp("outside-the-root")
    (root / "huge.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(20 * 2**20))
    (root / "wide.png").write_bytes(png(Image.new("1", (16_385, 1))))
    (root / "many-pixels.png").write_bytes(png(Image.new("1", (8200, 8200))))
    (outside / "secret.png").write_bytes(SMALL)
    return {
        "path-outside-the-root": (
            image_part(str(outside / "secret.png")),
            "media_path_not_allowed",
        ),
        "dot-dot-out-of-the-root": (
            image_part(f"{root}/../{outside.name}/secret.png"),
            "media_path_not_allowed",
        ),
        "host-not-allowed": (
            image_part(f"http://localhost:{web}/picture.png"),
            "media_url_not_allowed",
        ),
        "http-404": (image_part(f"http://127.0.0.1:{web}/missing.png"), "media_fetch_failed"),
        "not-base64": (image_part("data:image/png;base64,@@@not base64@@@"), "invalid_media"),
        "corrupt-image": (
            image_part(data_uri(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)),
            "invalid_media",
        ),
        "over-20-mib": (image_part(str(root / "huge.png")), "media_too_large"),
        "side-over-16384": (image_part(str(root / "wide.png")), "media_too_large"),
        "pixels-over-8192-squared": (image_part(str(root / "many-pixels.png")), "media_too_large"),
        "video-for-an-image-model": (
            {"type": "video_url", "video_url": {"url": data_uri(SMALL, "video/mp4")}},
            "unsupported_content_type",
        ),
    }


BAD = [
    "path-outside-the-root",
    "dot-dot-out-of-the-root",
    "host-not-allowed",
    "http-404",
    "not-base64",
    "corrupt-image",
    "over-20-mib",
    "side-over-16384",
    "pixels-over-8192-squared",
    "video-for-an-image-model",
]


def still_serving(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=chat(image_part(data_uri(SMALL))), max_tokens=1, temperature=0
    )
    assert response.choices[0].finish_reason == "length"


@pytest.mark.parametrize("name", BAD)
def test_bad_media_is_a_400_naming_the_part(
    client: openai.OpenAI,
    bad_parts: dict[str, tuple[Any, str]],
    loopback: tuple[int, list[str]],
    name: str,
) -> None:
    _, asked = loopback
    part, code = bad_parts[name]
    fetched = len(asked)
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, part)
    error = caught.value
    assert error.code == code, error.message
    assert error.param is not None and error.param.startswith("messages[0].content[0]"), error
    if name == "host-not-allowed":  # refused before any connection
        assert len(asked) == fetched
    still_serving(client)


def test_at_most_twenty_images(client: openai.OpenAI) -> None:
    small = image_part(data_uri(SMALL))
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, *[small] * 21)
    assert caught.value.code == "too_many"
    assert caught.value.param == "messages[0].content[20]"
    still_serving(client)


def test_a_body_over_the_limit_is_a_413(server: Server, client: openai.OpenAI) -> None:
    body = {"model": MODEL, "messages": chat(image_part(data_uri(bytes(17 * 2**20))))}
    response = server.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 413, response.text
    still_serving(client)


def test_mindie_bad_image_names_the_part(server: Server, client: openai.OpenAI) -> None:
    bad = {"type": "image_url", "image_url": "data:image/png;base64,@@@"}
    response = server.http.post(GENERATE, json=mindie_body({"type": "text", "text": "a"}, bad))
    assert response.status_code == 400, response.text
    assert "text_input[1].image_url" in response.json()["error"]
    still_serving(client)


def test_a_placeholder_typed_as_text_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, {"type": "text", "text": "<image>"}, image_part(data_uri(SMALL)))
    assert caught.value.code == "invalid_media"
    still_serving(client)


def test_text_only_chat_on_the_image_model(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
    )
    assert "Paris" in (response.choices[0].message.content or "")
