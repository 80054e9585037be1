"""``ferrollm serve --enable-lora --lora-modules a=DIR b=DIR`` as a real process on a tiny
model, driven by the official ``openai`` SDK and raw MindIE / Databricks bodies.

The request's model name picks the adapter (the path's on MindIE and Databricks routes);
``/v1/models`` lists the adapters with the base as ``parent``; the base and two adapters
answered concurrently each equal the offline engine on the same adapter (itself checked
against transformers + peft in tests/engine/test_lora_engine.py), streamed or not; an unknown
name is a 404 naming it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from ferrollm import LLM, LoRARequest, SamplingParams
from tiny_lora import make_adapter
from tiny_models import build_tiny_model

from .e2e_support import Server, serving, sse_payloads

TINY_FLAGS = ("--max-model-len", "256", "--kv-cache-memory", "16MiB")
ADAPTERS = {
    "sql": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj"]},
    "poet": {"r": 4, "lora_alpha": 8, "target_modules": ["o_proj", "gate_proj", "up_proj"]},
}
PROMPT = "Hello world"
BASE = "lora-base"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("lora-e2e")
    base = build_tiny_model("qwen2", root / BASE)
    adapters = {
        name: make_adapter(base, root / name, seed, **config)
        for seed, (name, config) in enumerate(ADAPTERS.items(), start=1)
    }
    # Outside the allowed root (the model's parent), and a link from inside to it.
    outside = make_adapter(base, root.parent / f"{root.name}-outside", 9, **ADAPTERS["sql"])
    (root / "link").symlink_to(outside)
    return base, adapters


@pytest.fixture(scope="module")
def lora_server(
    model: tuple[Path, dict[str, Path]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    base, adapters = model
    modules = [f"{name}={path}" for name, path in adapters.items()]
    flags = ("--enable-lora", "--max-loras", "2", "--lora-modules", *modules)
    flags += ("--allow-runtime-lora-updating", "--allowed-lora-path", str(base.parent))
    with serving(tmp_path_factory.mktemp("lora"), str(base), *TINY_FLAGS, *flags) as server:
        yield server


@pytest.fixture(scope="module")
def expected(model: tuple[Path, dict[str, Path]]) -> dict[str | None, tuple[str, str]]:
    """Offline greedy (completion text, chat reply) per adapter (None: the base)."""
    base, adapters = model
    llm = LLM(base, dtype="float32", quantization="none", max_model_len=256, enable_lora=True)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    out: dict[str | None, tuple[str, str]] = {}
    for name in (None, *adapters):
        lora = None if name is None else LoRARequest(name, 1, str(adapters[name]))
        text = llm.generate([PROMPT], greedy, lora)[0].outputs[0].text
        chat = llm.chat([[{"role": "user", "content": PROMPT}]], greedy, lora_request=lora)
        out[name] = (text, chat[0].outputs[0].text)
    assert len({texts for texts in out.values()}) == 3  # the adapters change the replies
    return out


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_models_lists_each_adapter_with_its_parent(
    lora_server: Server, model: tuple[Path, dict[str, Path]]
) -> None:
    _, adapters = model
    with _client(lora_server) as client:
        cards = {card.id: card.model_dump() for card in client.models.list()}
    assert set(cards) == {BASE, "sql", "poet"}
    assert cards[BASE]["parent"] is None
    for name, path in adapters.items():
        assert cards[name]["parent"] == BASE and cards[name]["root"] == str(path)


def test_base_and_two_adapters_answer_concurrently_as_offline(
    lora_server: Server, expected: dict[str | None, tuple[str, str]]
) -> None:
    def ask(model_name: str, stream: bool) -> tuple[str, str, str]:
        with _client(lora_server) as client:
            if stream:
                chunks = client.completions.create(
                    model=model_name, prompt=PROMPT, max_tokens=12, temperature=0, stream=True
                )
                text = "".join(c.choices[0].text for c in chunks)
            else:
                text = (
                    client.completions.create(
                        model=model_name, prompt=PROMPT, max_tokens=12, temperature=0
                    )
                    .choices[0]
                    .text
                )
            reply = client.chat.completions.create(
                model=model_name,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=12,
                temperature=0,
            )
            assert reply.model == model_name
            return model_name, text, reply.choices[0].message.content or ""

    jobs = [(name, stream) for name in (BASE, "sql", "poet") for stream in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: ask(*job), jobs))
    for name, text, reply in results:
        assert (text, reply) == expected[None if name == BASE else name], name


def test_mindie_and_databricks_paths_pick_the_adapter(
    lora_server: Server, expected: dict[str | None, tuple[str, str]]
) -> None:
    body = {"text_input": PROMPT, "parameters": {"max_new_tokens": 12, "do_sample": False}}
    response = lora_server.http.post("/v2/models/sql/generate", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["text_output"] == expected["sql"][0]
    assert response.json()["model_name"] == "sql"
    stream = lora_server.http.post("/v2/models/poet/generate_stream", json=body)
    frames = [json.loads(p) for p in sse_payloads(stream.content) if p != "[DONE]"]
    assert "".join(f["text_output"] for f in frames) == expected["poet"][0]
    dbx = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    response = lora_server.http.post("/serving-endpoints/sql/invocations", json=dbx)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == expected["sql"][0]


def test_an_unknown_model_is_a_404_naming_it(lora_server: Server) -> None:
    with _client(lora_server) as client, pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="sqll", prompt=PROMPT, max_tokens=2)
    assert "'sqll'" in str(err.value) and "'sql'" in str(err.value)
    body = {"text_input": PROMPT, "parameters": {"max_new_tokens": 2}}
    assert lora_server.http.post("/v2/models/nope/generate", json=body).status_code == 404


def _load(server: Server, name: str, path: str) -> tuple[int, str]:
    response = server.http.post(
        "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}
    )
    return response.status_code, response.text


def test_adapters_load_and_unload_at_run_time(
    lora_server: Server,
    model: tuple[Path, dict[str, Path]],
    expected: dict[str | None, tuple[str, str]],
) -> None:
    _, adapters = model
    status, text = _load(lora_server, "sql2", str(adapters["sql"]))
    assert status == 200 and "sql2" in text, text
    with _client(lora_server) as client:
        assert "sql2" in {card.id for card in client.models.list()}
        out = client.completions.create(model="sql2", prompt=PROMPT, max_tokens=12, temperature=0)
        assert out.choices[0].text == expected["sql"][0]
    assert _load(lora_server, "sql2", str(adapters["sql"]))[0] == 400  # already loaded
    unload = lora_server.http.post("/v1/unload_lora_adapter", json={"lora_name": "sql2"})
    assert unload.status_code == 200, unload.text
    body = {"model": "sql2", "prompt": PROMPT, "max_tokens": 2}
    assert lora_server.http.post("/v1/completions", json=body).status_code == 404
    again = lora_server.http.post("/v1/unload_lora_adapter", json={"lora_name": "sql2"})
    assert again.status_code == 404


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("{root}/link", "outside the allowed"),  # a symlink out of the root
        ("{root}/sql/../../{root_name}-outside", "outside the allowed"),
        ("{root}/missing", "does not exist"),
        ("{root}/{base_name}", "adapter_config.json"),  # a model, not an adapter
    ],
)
def test_runtime_loads_outside_the_root_or_of_bad_adapters_are_400(
    lora_server: Server, model: tuple[Path, dict[str, Path]], path: str, words: str
) -> None:
    root = model[0].parent
    path = path.format(root=root, root_name=root.name, base_name=model[0].name)
    status, text = _load(lora_server, "bad", path)
    assert status == 400 and words in text and "lora_path" in text, text
    with _client(lora_server) as client:
        assert "bad" not in {card.id for card in client.models.list()}


def test_unloading_an_adapter_lets_its_running_requests_finish_on_it(
    lora_server: Server, model: tuple[Path, dict[str, Path]]
) -> None:
    base, adapters = model
    llm = LLM(base, dtype="float32", quantization="none", max_model_len=256, enable_lora=True)
    params = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)
    lora = LoRARequest("poet", 1, str(adapters["poet"]))
    want = llm.generate([PROMPT], params, lora)[0].outputs[0].text
    assert _load(lora_server, "poet2", str(adapters["poet"]))[0] == 200
    body = {"model": "poet2", "prompt": PROMPT, "max_tokens": 80, "temperature": 0}
    body |= {"ignore_eos": True, "stream": True}
    with lora_server.http.stream("POST", "/v1/completions", json=body) as response:
        chunks = response.iter_bytes()
        head = next(chunks)
        unload = lora_server.http.post("/v1/unload_lora_adapter", json={"lora_name": "poet2"})
        assert unload.status_code == 200, unload.text
        rest = b"".join(chunks)
    payloads = sse_payloads(head + rest)
    assert payloads[-1] == "[DONE]"
    assert "".join(json.loads(p)["choices"][0]["text"] for p in payloads[:-1]) == want


def test_runtime_updates_need_the_api_key_when_keys_are_configured(
    model: tuple[Path, dict[str, Path]], tmp_path: Path
) -> None:
    base, adapters = model
    flags = ("--enable-lora", "--allow-runtime-lora-updating", "--allowed-lora-path")
    flags += (str(base.parent), "--api-key", "k-1")
    with serving(tmp_path, str(base), *TINY_FLAGS, *flags) as server:
        body = {"lora_name": "sql", "lora_path": str(adapters["sql"])}
        refused = server.http.post("/v1/load_lora_adapter", json=body)
        assert refused.status_code == 401, refused.text
        keyed = {"Authorization": "Bearer k-1"}
        loaded = server.http.post("/v1/load_lora_adapter", json=body, headers=keyed)
        assert loaded.status_code == 200, loaded.text
        unload = {"lora_name": "sql"}
        assert server.http.post("/v1/unload_lora_adapter", json=unload).status_code == 401
        done = server.http.post("/v1/unload_lora_adapter", json=unload, headers=keyed)
        assert done.status_code == 200, done.text
