"""Media content parts over HTTP (docs/api/common.md#media-parts): a multimodal engine (the tiny
text model behind `FakeProcessor`) takes images from data URIs, allowed local files and allowed
hosts on chat and MindIE generate; every bad part is a 4xx naming it; a text-only engine
refuses media with ``unsupported_content_type`` and joins text-only part arrays; usage counts
the placeholder tokens; ``/v1/models`` says what the model takes."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from media_fakes import (
    PARTS_TEMPLATE,
    TOKENS_PER_ITEM,
    FakeProcessor,
    MultimodalEngine,
    data_uri,
    png,
    wav,
)
from server_harness import MODEL, ROUTE_PATHS, Server, sse_json

from ferrollm.engine import AsyncEngine
from ferrollm.multimodal.templates import reads_parts, template_part
from ferrollm.options import EngineConfigError
from ferrollm.server.app import App
from ferrollm.server.context import ServerContext
from ferrollm.server_config import ServerConfig
from loopback_http import loopback_server

CHAT, GENERATE = ROUTE_PATHS["chat"], ROUTE_PATHS["generate"]


class MediaApps:
    """Apps over one multimodal engine: ``open`` (a local root, 127.0.0.1 allowed) and
    ``closed`` (no local files, public hosts only)."""

    def __init__(self, server: Server, root: Path) -> None:
        self.server = server
        self.root = root
        self.processor = FakeProcessor(server.tokenizer)
        engine = cast(AsyncEngine, MultimodalEngine(server.engine, self.processor))
        opened = ServerConfig(
            served_model_name=MODEL,
            allowed_local_media_path=str(root),
            allowed_media_domains=("127.0.0.1",),
        )
        self.open = App(ctx=ServerContext.build(engine, opened))
        self.closed = App(ctx=ServerContext.build(engine, ServerConfig(served_model_name=MODEL)))
        #: A chat template that reads typed parts (SmolVLM's way).
        parts_engine = MultimodalEngine(server.engine, self.processor, PARTS_TEMPLATE)
        self.parts = App(ctx=ServerContext.build(cast(AsyncEngine, parts_engine), opened))
        image_only = FakeProcessor(server.tokenizer, kinds=frozenset({"image"}))
        image_engine = cast(AsyncEngine, MultimodalEngine(server.engine, image_only))
        self.image_only = App(ctx=ServerContext.build(image_engine, opened))
        #: Room for one image's tokens and a word or two.
        small = ServerConfig(served_model_name=MODEL, max_input_tokens=TOKENS_PER_ITEM + 3)
        self.small = App(ctx=ServerContext.build(engine, small))

    def post(self, path: str, body: Any, app: App | None = None) -> httpx.Response:
        return self.server.post(path, body, app=app or self.open)


@pytest.fixture(scope="module")
def media(server: Server, tmp_path_factory: pytest.TempPathFactory) -> MediaApps:
    root = tmp_path_factory.mktemp("media-root")
    (root / "cat.png").write_bytes(png())
    return MediaApps(server, root)


@pytest.fixture
def calls(media: MediaApps) -> list[Any]:
    media.processor.calls.clear()
    return media.processor.calls


def chat(content: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def image(url: str, bare: bool = False) -> dict[str, Any]:
    return {"type": "image_url", "image_url": url if bare else {"url": url}}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def generate(parts: Any) -> dict[str, Any]:
    return {"text_input": parts, "parameters": {"max_new_tokens": 2, "do_sample": False}}


def error(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return cast(dict[str, Any], response.json()["error"])


# --- chat ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bare", [False, True], ids=["object", "bare-string"])
def test_chat_image_stands_as_the_placeholder_and_counts_in_usage(
    media: MediaApps, calls: list[Any], bare: bool
) -> None:
    body = chat([text("Look: "), image(data_uri(png()), bare), text(" What is it?")], max_tokens=2)
    response = media.post(CHAT, body)
    assert response.status_code == 200, response.text
    (call,) = calls
    assert "Look: <image> What is it?" in call.prompt
    assert call.media[0].width == 4 and call.media[0].height == 3
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == len(call.token_ids)
    # The placeholder's tokens count: the text prompt without the image is shorter by them.
    plain = media.server.tokenizer.encode(call.prompt.replace("<image>", ""), False)
    assert usage["prompt_tokens"] == len(plain) + TOKENS_PER_ITEM


def test_chat_images_across_messages_keep_their_order(media: MediaApps, calls: list[Any]) -> None:
    messages = [
        {"role": "user", "content": [image(data_uri(png(4, 3))), text("first")]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [text("second"), image(data_uri(png(2, 5)))]},
    ]
    response = media.post(CHAT, {"model": MODEL, "messages": messages, "max_tokens": 2})
    assert response.status_code == 200, response.text
    (call,) = calls
    prompt = call.prompt
    assert prompt.index("<image>first") < prompt.index("second<image>")
    assert [(m.width, m.height) for m in call.media] == [(4, 3), (2, 5)]


def test_chat_audio_part(media: MediaApps, calls: list[Any]) -> None:
    audio = {"type": "audio_url", "audio_url": {"url": data_uri(wav(), "audio/wav")}}
    response = media.post(CHAT, chat([text("Transcribe: "), audio], max_tokens=1))
    assert response.status_code == 200, response.text
    (call,) = calls
    assert "Transcribe: <audio>" in call.prompt
    assert call.media[0].sample_rate == 16_000 and call.media[0].duration_s > 0.2


@dataclass
class EightKilohertzProcessor(FakeProcessor):
    """A processor whose features need audio at 8 kHz (``sample_rate``, as Qwen2-Audio's
    processor names its 16 kHz)."""

    sample_rate: int = 8_000


def test_audio_is_decoded_at_the_processors_rate(server: Server, media: MediaApps) -> None:
    processor = EightKilohertzProcessor(server.tokenizer)
    engine = cast(AsyncEngine, MultimodalEngine(server.engine, processor))
    app = App(ctx=ServerContext.build(engine, ServerConfig(served_model_name=MODEL)))
    audio = {"type": "audio_url", "audio_url": {"url": data_uri(wav(0.25), "audio/wav")}}
    response = media.post(CHAT, chat([text("Transcribe: "), audio], max_tokens=1), app)
    assert response.status_code == 200, response.text
    (call,) = processor.calls
    (clip,) = call.media
    assert clip.sample_rate == 8_000 and abs(len(clip.samples) - 2_000) <= 16


def test_chat_template_that_reads_parts_gets_typed_parts(
    media: MediaApps, calls: list[Any]
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [text("What is "), image(data_uri(png())), text("?")]},
    ]
    body = {"model": MODEL, "messages": messages, "max_tokens": 1}
    response = media.post(CHAT, body, media.parts)
    assert response.status_code == 200, response.text
    (call,) = calls
    assert call.prompt == "System:Be brief.User:What is <image>?Assistant:"


def test_which_templates_read_parts() -> None:
    # A type-testing template (SmolVLM's), a key-testing one (Qwen2-Audio's) and a text one.
    assert reads_parts(PARTS_TEMPLATE)
    assert reads_parts("{% for c in m['content'] %}{% if 'audio' in c %}A{% endif %}{% endfor %}")
    assert not reads_parts("{{ message['content'] }}{% if x.type == 'function' %}{% endif %}")
    assert not reads_parts(None)
    # Either kind of template recognises the media part the renderers give it.
    assert template_part("audio")["type"] == "audio" and "audio" in template_part("audio")


def test_chat_local_file_under_the_root(media: MediaApps, calls: list[Any]) -> None:
    path = media.root / "cat.png"
    for url in (str(path), path.as_uri()):
        response = media.post(CHAT, chat([image(url, bare=True), text("?")], max_tokens=2))
        assert response.status_code == 200, response.text
    assert len(calls) == 2


def test_chat_local_file_outside_the_root_or_without_one(media: MediaApps, tmp_path: Path) -> None:
    outside = tmp_path / "dog.png"
    outside.write_bytes(png())
    body = chat([text("?"), image(str(outside), bare=True)])
    e = error(media.post(CHAT, body))
    assert e["code"] == "media_path_not_allowed"
    assert e["param"] == "messages[0].content[1].image_url"
    inside = chat([text("?"), image(str(media.root / "cat.png"), bare=True)])
    e = error(media.post(CHAT, inside, media.closed))
    assert e["code"] == "media_path_not_allowed"
    assert "messages[0].content[1]" in e["message"]


def test_chat_http_url_from_an_allowed_host_only(media: MediaApps, calls: list[Any]) -> None:
    with loopback_server({"/cat.png": png()}) as (port, asked):
        url = f"http://127.0.0.1:{port}/cat.png"
        response = media.post(CHAT, chat([image(url), text("?")], max_tokens=2))
        assert response.status_code == 200, response.text
        assert asked == ["/cat.png"] and len(calls) == 1
        e = error(media.post(CHAT, chat([image(url), text("?")]), media.closed))
        assert e["code"] == "media_url_not_allowed"
        assert e["param"] == "messages[0].content[0].image_url"
        assert asked == ["/cat.png"]  # refused before any connection


def test_a_kind_the_model_does_not_take_is_refused_before_loading(media: MediaApps) -> None:
    with loopback_server({"/a.wav": wav()}) as (port, asked):
        audio = {"type": "audio_url", "audio_url": f"http://127.0.0.1:{port}/a.wav"}
        e = error(media.post(CHAT, chat([text("?"), audio]), media.image_only))
        assert asked == []
    assert e["code"] == "unsupported_content_type"
    assert e["param"] == "messages[0].content[1].type"
    assert "text, image" in e["message"]
    (card,) = media.server.get("/v1/models", media.image_only).json()["data"]
    assert card["modalities"] == ["text", "image"]


def test_chat_at_most_twenty_media(media: MediaApps, calls: list[Any]) -> None:
    uri = data_uri(png())
    e = error(media.post(CHAT, chat([text("?"), *[image(uri) for _ in range(21)]])))
    assert e["code"] == "too_many" and e["param"] == "messages[0].content[21]"
    assert calls == []
    response = media.post(CHAT, chat([text("?"), *[image(uri) for _ in range(20)]], max_tokens=1))
    assert response.status_code == 200, response.text
    assert len(calls[0].media) == 20


BAD_PARTS = {
    "corrupt-image": (
        image(data_uri(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)),
        "invalid_media",
        "messages[0].content[1].image_url",
    ),
    "png-in-audio-part": (
        {"type": "audio_url", "audio_url": data_uri(png(), "audio/wav")},
        "unsupported_content_type",
        "messages[0].content[1].audio_url",
    ),
    "not-base64": (
        image("data:image/png;base64,@@@not base64@@@"),
        "invalid_media",
        "messages[0].content[1].image_url",
    ),
    "missing-file": (
        image("/definitely/not/here.png", bare=True),
        "media_path_not_allowed",
        "messages[0].content[1].image_url",
    ),
}


@pytest.mark.parametrize("name", list(BAD_PARTS))
def test_chat_bad_media_is_a_400_naming_the_part(
    media: MediaApps, calls: list[Any], name: str
) -> None:
    part, code, param = BAD_PARTS[name]
    e = error(media.post(CHAT, chat([text("?"), part])))
    assert e["param"].startswith(param) and param in e["message"], e
    assert e["code"] == code, e
    assert calls == []
    # The server goes on.
    ok = media.post(CHAT, chat([text("?"), image(data_uri(png()))], max_tokens=1))
    assert ok.status_code == 200, ok.text


def test_processor_refusal_is_a_400_naming_the_part(media: MediaApps) -> None:
    # A literal placeholder in the text leaves the processor one item short: a 400, not a 500.
    e = error(media.post(CHAT, chat([text("<image>"), image(data_uri(png()))])))
    assert e["code"] == "invalid_media"
    assert e["param"] is not None and e["param"].startswith("messages")


def test_chat_streamed_and_whole_with_the_openai_sdk(media: MediaApps, calls: list[Any]) -> None:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=media.open))
    content: Any = [text("Describe "), image(data_uri(png()))]

    async def go() -> tuple[Any, list[Any]]:
        async with openai.AsyncOpenAI(
            base_url="http://t/v1", api_key="unused", max_retries=0, http_client=http
        ) as client:
            messages: Any = [{"role": "user", "content": content}]
            whole = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=3, temperature=0
            )
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=3, temperature=0, stream=True
            )
            return whole, [chunk async for chunk in stream]

    whole, chunks = media.server.run(go())
    assert len(calls) == 2 and calls[0].prompt == calls[1].prompt
    # The template wrote the BOS: the processor adds no special tokens (as for text chats).
    assert not calls[0].add_special_tokens and not calls[1].add_special_tokens
    assert whole.usage.prompt_tokens == len(calls[0].token_ids)
    assert chunks[-1].usage.prompt_tokens == len(calls[1].token_ids)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content


# --- MindIE generate ----------------------------------------------------------------------


@pytest.mark.parametrize("bare", [False, True], ids=["object", "bare-string"])
def test_generate_joins_parts_with_no_template(
    media: MediaApps, calls: list[Any], bare: bool
) -> None:
    body = generate([text("Describe"), image(data_uri(png()), bare), text("briefly")])
    response = media.post(GENERATE, body)
    assert response.status_code == 200, response.text
    (call,) = calls
    assert call.prompt == "Describe<image>briefly" and call.add_special_tokens
    assert response.json()["details"]["generated_tokens"] >= 1


def test_generate_stream_with_an_image(media: MediaApps, calls: list[Any]) -> None:
    body = generate([image(str(media.root / "cat.png"), bare=True), text("what?")])
    response = media.post(ROUTE_PATHS["generate_stream"], body)
    frames = sse_json(response, done=False)
    assert frames[-1]["details"]["finish_reason"] in ("length", "eos_token")
    assert calls[0].prompt == "<image>what?"


def test_generate_prompt_limit_counts_the_image_tokens(media: MediaApps) -> None:
    uri = data_uri(png())
    response = media.post(GENERATE, generate([text("Hi"), image(uri)]), media.small)
    assert response.status_code == 200, response.text
    long_text = text("one two three four five six seven eight")
    response = media.post(GENERATE, generate([long_text]), media.small)
    assert response.status_code == 400, response.text
    short_text = text("one two")
    alone = media.post(GENERATE, generate([short_text]), media.small)
    assert alone.status_code == 200, alone.text
    # The same words pass alone, not with the image's tokens.
    response = media.post(GENERATE, generate([short_text, image(uri), short_text]), media.small)
    assert response.status_code == 400, response.text
    assert "token" in response.json()["error"]


def test_generate_takes_one_image_only(media: MediaApps, calls: list[Any]) -> None:
    uri = data_uri(png())
    response = media.post(GENERATE, generate([text("a"), image(uri), image(uri)]))
    assert response.status_code == 400, response.text
    assert "text_input[2]" in response.json()["error"]
    video = {"type": "video_url", "video_url": uri}
    response = media.post(GENERATE, generate([text("a"), video]))
    assert response.status_code == 400 and "text_input[1]" in response.json()["error"]
    assert calls == []


def test_generate_bad_image_names_the_part(media: MediaApps, calls: list[Any]) -> None:
    bad = image(data_uri(b"GIF89a" + b"\x00" * 10, "image/gif"))
    response = media.post(GENERATE, generate([text("a"), bad]))
    assert response.status_code == 400, response.text
    assert "text_input[1].image_url" in response.json()["error"]
    assert calls == []


# --- text-only engine, Databricks, models -------------------------------------------------


def test_text_only_model_refuses_media_before_any_work(server: Server) -> None:
    body = chat([text("hi"), image(data_uri(png()))])
    e = error(server.post(CHAT, body))
    assert e["code"] == "unsupported_content_type"
    assert e["param"] == "messages[0].content[1].type"
    assert "text-only" in e["message"]
    response = server.post(GENERATE, generate([text("hi"), image("/x.png", bare=True)]))
    assert response.status_code == 400 and "text_input[1]" in response.json()["error"]


@pytest.mark.parametrize("app_name", ["text-only", "multimodal"])
def test_text_only_arrays_are_joined(server: Server, media: MediaApps, app_name: str) -> None:
    app = server.app if app_name == "text-only" else media.open
    greedy = {"max_tokens": 2, "temperature": 0}
    joined = server.post(CHAT, chat("Hello there", **greedy), app=app).json()
    parts = server.post(CHAT, chat([text("Hello "), text("there")], **greedy), app=app)
    assert parts.status_code == 200, parts.text
    assert parts.json()["usage"]["prompt_tokens"] == joined["usage"]["prompt_tokens"]
    assert parts.json()["choices"][0]["message"] == joined["choices"][0]["message"]
    whole = server.post(GENERATE, generate("Hello there"), app=app).json()
    split = server.post(GENERATE, generate([text("Hello "), text("there")]), app=app).json()
    assert split["text_output"] == whole["text_output"]


def test_databricks_chat_takes_text_and_media_parts(
    media: MediaApps, calls: list[Any], server: Server
) -> None:
    path = ROUTE_PATHS["databricks"]
    body = {"messages": [{"role": "user", "content": [text("Hi "), text("you")]}], "max_tokens": 2}
    response = media.post(path, body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] > 0
    body["messages"][0]["content"].append(image(data_uri(png())))
    response = media.post(path, body)
    assert response.status_code == 200, response.text
    (call,) = calls
    assert "<image>" in call.prompt and len(call.media) == 1
    assert response.json()["usage"]["prompt_tokens"] == len(call.token_ids)
    # A text-only model refuses the part, naming it.
    response = server.post(path, body)
    assert response.status_code == 400, response.text
    assert "messages[0].content[2].type" in response.json()["message"]


def test_models_say_what_the_model_takes(server: Server, media: MediaApps) -> None:
    (card,) = server.get("/v1/models", media.open).json()["data"]
    assert card["modalities"] == ["text", "audio", "image", "video"]
    (card,) = server.get("/v1/models").json()["data"]
    assert card["modalities"] == ["text"]


def test_a_bad_local_media_root_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match="--allowed-local-media-path"):
        ServerConfig(allowed_local_media_path="relative/dir")
    with pytest.raises(EngineConfigError, match="allowed_local_media_path"):
        ServerConfig(allowed_local_media_path=str(tmp_path / "missing"))
    config = ServerConfig(allowed_media_domains="B.example, a.example")  # type: ignore[arg-type]
    assert config.allowed_media_domains == ("a.example", "b.example")


def test_loads_run_off_the_event_loop(media: MediaApps, calls: list[Any]) -> None:
    # Eight requests at once, each with an image: all answered while the loop stays free.
    uri = data_uri(png(64, 64))

    async def go() -> list[int]:
        client = media.server.client(media.open)
        bodies = [chat([text(str(i)), image(uri)], max_tokens=1) for i in range(8)]
        responses = await asyncio.gather(
            *(client.post(CHAT, content=json.dumps(b).encode()) for b in bodies)
        )
        return [r.status_code for r in responses]

    assert media.server.run(go()) == [200] * 8
    assert len(calls) == 8
    loop_thread = media.server.run(_thread_id())
    assert all(call.thread != loop_thread for call in calls)


async def _thread_id() -> int:
    return threading.get_ident()
