"""The web playground (docs/serving.md#the-playground) in a real headless Chromium, driven by
Selenium, against real ``ferrollm serve`` processes on the default model.

What a user does with it: a chat whose streamed answer appears (and equals the server's own
non-streamed answer), Stop mid-stream, raw completions, tokens coloured by log probability
with their alternatives, a parsed tool call, a 400 shown with the server's message, and the
key prompt of a server with ``--api-key``. After every test the browser's console must hold
no error: the only SEVERE entries allowed are the network lines of the 4xx a test provokes.
Screenshots go to ``$FERROLLM_TEST_ARTIFACTS`` (else a temporary directory), printed.

Chromium and chromedriver come from Debian (``make test-python`` installs them): these tests
fail rather than skip when they are missing.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from PIL import Image
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select

from tiny_lora import make_adapter
from tiny_models import build_tiny_model

from .e2e_support import MODEL, Server, serving
from .test_e2e_tools import ASK, TOOLS

T = TypeVar("T")
#: Seconds a generation may take in the page (CPU runners are slow, and shared).
WAIT_S = 120.0
KEY = "playground-secret"
ADAPTER = "poet"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: ``$FERROLLM_TEST_ARTIFACTS/playground`` or a temp dir."""
    root = os.environ.get("FERROLLM_TEST_ARTIFACTS")
    path = Path(root) / "playground" if root else tmp_path_factory.mktemp("playground")
    path.mkdir(parents=True, exist_ok=True)
    print(f"\nplayground screenshots: {path}")
    return path


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    """Headless Debian Chromium with the browser console recorded."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and chromedriver, (
        "chromium and chromedriver are not on PATH: `make test-python` installs Debian's "
        "chromium and chromium-driver (apt-get)"
    )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--disable-gpu"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=chromedriver)
    browser = webdriver.Chrome(options=options, service=service)
    try:
        yield browser
    finally:
        browser.quit()


class Page:
    """The playground in ``driver``, at ``url``."""

    def __init__(self, driver: WebDriver, url: str, artifacts: Path) -> None:
        self.driver = driver
        self.url = url
        self.artifacts = artifacts
        driver.get(url + "/")
        self.until(lambda: self.options() or self.dialog_open())

    def el(self, element_id: str) -> WebElement:
        return self.driver.find_element(By.ID, element_id)

    def until(self, check: Callable[[], T], timeout: float = 30.0) -> T:
        """Poll ``check`` until it returns something true; fail with the page's state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if value := check():
                    return value
            except StaleElementReferenceException:
                pass
            time.sleep(0.1)
        self.shot("timeout")
        pytest.fail(f"timed out; the page shows:\n{self.el('transcript').text}\n{self.error()}")

    def options(self) -> list[str]:
        return [o.get_attribute("value") or "" for o in self.el("model").find_elements(
            By.TAG_NAME, "option")]  # fmt: skip

    def dialog_open(self) -> bool:
        return self.el("key-dialog").get_attribute("open") is not None

    def error(self) -> str:
        box = self.el("error")
        return box.text if box.is_displayed() else ""

    def fill(self, element_id: str, value: str) -> None:
        field = self.el(element_id)
        field.clear()
        if value:
            field.send_keys(value)

    def send(self, text: str) -> WebElement:
        """Type ``text`` in the prompt and press Enter; the answer's element."""
        before = len(self.answers())
        prompt = self.el("prompt")
        prompt.send_keys(text)
        prompt.send_keys(Keys.ENTER)
        return self.until(lambda: len(self.answers()) > before and self.answers()[-1])

    def answers(self) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, ".msg.assistant, .msg.completion")

    def finished(self, answer: WebElement) -> str:
        """Wait for ``answer`` to finish streaming and the UI to be ready; its text."""
        self.until(lambda: "streaming" not in (answer.get_attribute("class") or ""), WAIT_S)
        self.until(lambda: self.el("send").is_enabled() and not self.el("stop-button").is_enabled())
        return answer.find_element(By.CLASS_NAME, "content").text

    def shot(self, name: str) -> Path:
        path = self.artifacts / f"{name}.png"
        self.driver.save_screenshot(str(path))
        print(f"screenshot: {path}")
        return path


def console_errors(driver: WebDriver, allowed_statuses: tuple[int, ...] = ()) -> list[Any]:
    """The SEVERE console entries, but for the network lines of the statuses a test provoked
    (Chromium logs every 4xx answer to fetch() as 'Failed to load resource')."""
    errors = []
    for entry in driver.get_log("browser"):
        if entry["level"] != "SEVERE":
            continue
        expected = entry.get("source") == "network" and any(
            f"status of {status}" in entry["message"] for status in allowed_statuses
        )
        if not expected:
            errors.append(entry)
    return errors


@pytest.fixture
def page(driver: WebDriver, server: Server, artifacts: Path) -> Iterator[Page]:
    """The playground of the default server; the console must stay clean."""
    driver.get_log("browser")  # drop what earlier tests left
    yield Page(driver, server.url, artifacts)
    assert console_errors(driver) == []


def greedy(page: Page, max_tokens: int) -> None:
    page.fill("temperature", "0")
    page.fill("max_tokens", str(max_tokens))


def test_a_chat_streams_its_answer_and_equals_the_servers(page: Page, server: Server) -> None:
    assert page.options() == [MODEL]
    assert page.el("prompt") == page.driver.switch_to.active_element  # ready to type
    page.el("prompt").send_keys(Keys.TAB)  # the keyboard reaches the buttons next
    assert page.driver.switch_to.active_element == page.el("send")
    assert not page.el("attachments").is_displayed()  # a text-only model: no media to attach
    greedy(page, 24)
    page.fill("system", "You are a concise assistant.")
    answer = page.send("What is the capital of France?")
    text = page.finished(answer)
    assert text
    page.shot("chat")
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        "temperature": 0,
        "max_tokens": 24,
    }
    expected = server.http.post("/v1/chat/completions", json=body).json()
    assert text == expected["choices"][0]["message"]["content"].strip()
    assert page.el("finish").get_attribute("value") == expected["choices"][0]["finish_reason"]
    assert page.el("ttft").get_attribute("value").endswith(" ms")
    assert page.el("num-tokens").get_attribute("value") == str(
        expected["usage"]["completion_tokens"]
    )
    assert float(page.el("tps").get_attribute("value")) > 0
    # The request as code: curl's body is the request sent, the Python is Python.
    page.el("copy-curl").click()
    curl = page.until(lambda: page.el("snippet").get_attribute("value"))
    assert curl.startswith(f"curl {server.url}/v1/chat/completions -N")
    sent = json.loads(curl.split("-d '", 1)[1].rstrip("'"))
    assert sent["messages"] == body["messages"] and sent["max_tokens"] == 24 and sent["stream"]
    page.el("copy-python").click()
    python = page.until(
        lambda: "openai" in (text := page.el("snippet").get_attribute("value") or "") and text
    )
    compile(python, "snippet.py", "exec")
    assert "client.chat.completions.create(" in python and "max_tokens=24" in python
    # The second turn carries the first in its history.
    page.el("snippet-close").click()
    second = page.send("And of Italy?")
    assert page.finished(second)
    assert len(page.driver.find_elements(By.CSS_SELECTOR, ".msg.user")) == 2


def test_stop_ends_the_stream_and_the_page_is_ready_again(page: Page, server: Server) -> None:
    page.fill("max_tokens", "1500")
    page.fill("extra", '{"ignore_eos": true}')
    answer = page.send("Tell me a very long story about a robot who learns to paint.")
    content = answer.find_element(By.CLASS_NAME, "content")
    page.until(lambda: len(content.text) >= 10, WAIT_S)
    assert page.el("stop-button").is_enabled() and not page.el("send").is_enabled()
    page.driver.switch_to.active_element.send_keys(Keys.ESCAPE)  # Escape stops
    page.until(lambda: "stopped" in (answer.get_attribute("class") or ""))
    stopped = page.finished(answer)
    time.sleep(2.0)
    assert content.text == stopped  # no longer growing
    # The server saw the disconnect and aborted the generation (its 1500 tokens would take
    # minutes here).
    page.until(lambda: server.metric("ferrollm_num_requests_running") == 0)
    assert page.el("finish").get_attribute("value") == "stopped"
    assert page.el("prompt") == page.driver.switch_to.active_element
    page.fill("extra", "")
    page.fill("max_tokens", "4")
    assert page.finished(page.send("Hello"))  # usable again
    page.shot("stopped")


def test_completions_mode_completes_the_raw_prompt(page: Page, server: Server) -> None:
    page.el("mode-completions").click()
    assert not page.el("system").is_displayed() and not page.el("tools").is_displayed()
    greedy(page, 12)
    answer = page.send("def add(a, b):")
    text = page.finished(answer)
    body = {"model": MODEL, "prompt": "def add(a, b):", "temperature": 0, "max_tokens": 12}
    expected = server.http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert text == expected.strip("\n")
    assert page.driver.find_elements(By.CSS_SELECTOR, ".msg.prompt")
    page.shot("completions")


def test_tokens_are_coloured_by_logprob_with_their_alternatives(page: Page) -> None:
    greedy(page, 12)
    page.el("logprobs").click()
    page.fill("top_logprobs", "3")
    answer = page.send("Name three colours.")
    page.finished(answer)
    tokens = answer.find_elements(By.CSS_SELECTOR, ".tok[data-logprob]")
    assert tokens
    for token in tokens:
        assert float(token.get_attribute("data-logprob") or "1") <= 0
        title = token.get_attribute("title") or ""
        assert "logprob" in title and title.count("%") >= 2  # the token and its alternatives
    assert tokens[0].value_of_css_property("background-color") != "rgba(0, 0, 0, 0)"
    ActionChains(page.driver).move_to_element(tokens[0]).perform()  # hover shows the tooltip
    tip = page.until(lambda: page.el("tok-tip").is_displayed() and page.el("tok-tip"))
    assert tip.text == tokens[0].get_attribute("title")
    page.shot("logprobs")
    if len(tokens) > 1:  # the keyboard: focus shows the tooltip, arrows move between tokens
        tokens[0].send_keys(Keys.ARROW_RIGHT)
        assert page.driver.switch_to.active_element == tokens[1]
        assert page.el("tok-tip").text == tokens[1].get_attribute("title")


def test_a_tool_call_is_shown_parsed(page: Page) -> None:
    page.fill("system", ASK[0]["content"])
    page.el("tools").send_keys(json.dumps(TOOLS))
    page.el("tool-choice").send_keys("required")
    page.fill("max_tokens", "80")
    page.fill("seed", "1")
    answer = page.send(ASK[1]["content"])
    page.finished(answer)
    calls = answer.find_elements(By.CLASS_NAME, "tool-call")
    assert calls, answer.text
    name = calls[0].find_element(By.CLASS_NAME, "tool-name").text
    assert name in {"get_delivery_date", "get_weather"}
    arguments = json.loads(calls[0].find_element(By.CLASS_NAME, "tool-args").text)
    assert isinstance(arguments, dict) and arguments
    # "required" allows several calls: the cap may cut a later one, never the first.
    assert page.el("finish").get_attribute("value") in ("tool_calls", "length")
    page.shot("tool-call")


def test_json_schema_output(page: Page) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    Select(page.el("response-format")).select_by_value("json_schema")
    page.fill("json-schema", json.dumps(schema))
    greedy(page, 60)
    answer = page.send("What is the capital of France?")
    value = json.loads(page.finished(answer))
    assert set(value) == {"city"} and isinstance(value["city"], str)


def test_a_bad_parameter_shows_the_servers_message(
    driver: WebDriver, server: Server, artifacts: Path
) -> None:
    driver.get_log("browser")
    page = Page(driver, server.url, artifacts)
    page.fill("top_p", "1.5")
    page.el("prompt").send_keys("Hello", Keys.ENTER)  # refused: no answer stays to wait for
    shown = page.until(page.error)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "top_p": 1.5}
    response = server.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert shown.startswith("400: ") and message in shown and "top_p" in shown
    assert page.el("send").is_enabled()
    # The refused turn is undone: no empty answer, and the text is back in the prompt box.
    assert page.answers() == [] and page.el("prompt").get_attribute("value") == "Hello"
    page.shot("error")
    assert console_errors(driver, allowed_statuses=(400,)) == []


@pytest.fixture(scope="module")
def vision_server(
    smolvlm_demo_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The SmolVLM demo checkpoint: a model whose card lists the image modality."""
    with serving(tmp_path_factory.mktemp("playground-vision"), str(smolvlm_demo_dir)) as server:
        yield server


def test_an_attached_image_goes_as_a_data_uri(
    driver: WebDriver, vision_server: Server, artifacts: Path, tmp_path: Path
) -> None:
    picture = tmp_path / "red.png"
    Image.new("RGB", (32, 32), (200, 30, 30)).save(picture)
    driver.get_log("browser")
    page = Page(driver, vision_server.url, artifacts)
    assert page.el("attachments").is_displayed()
    assert page.el("attach").get_attribute("accept") == "image/*"
    page.el("attach").send_keys(str(picture))
    page.until(lambda: "image: red.png" in page.el("attached").text)
    greedy(page, 8)
    answer = page.send("What colour is this picture?")
    assert page.finished(answer)
    notes = page.driver.find_elements(By.CSS_SELECTOR, ".msg.user .note")
    assert notes and "red.png" in notes[-1].text
    assert page.el("attached").text == ""  # sent with this turn, not the next
    page.shot("image")
    page.el("copy-curl").click()
    curl = page.until(lambda: page.el("snippet").get_attribute("value"))
    content = json.loads(curl.split("-d '", 1)[1].rstrip("'"))["messages"][-1]["content"]
    assert content[0] == {"type": "text", "text": "What colour is this picture?"}
    assert content[1]["type"] == "image_url"
    assert content[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert console_errors(driver) == []


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A tiny random model (what it says does not matter here) with one LoRA adapter, behind
    an API key."""
    root = tmp_path_factory.mktemp("playground-keyed")
    base = build_tiny_model("qwen2", root / "tiny-base")
    adapter = make_adapter(base, root / ADAPTER, 1, r=4, lora_alpha=8, target_modules=["q_proj"])
    flags = ("--max-model-len", "256", "--kv-cache-memory", "16MiB", "--api-key", KEY)
    flags += ("--enable-lora", "--lora-modules", f"{ADAPTER}={adapter}")
    with serving(root, str(base), *flags) as server:
        yield server


def test_a_keyed_server_asks_for_the_key_and_then_works(
    driver: WebDriver, keyed_server: Server, artifacts: Path
) -> None:
    assert keyed_server.http.get("/").status_code == 200  # the page itself needs no key
    assert keyed_server.http.get("/v1/models").status_code == 401
    driver.get_log("browser")
    page = Page(driver, keyed_server.url, artifacts)
    assert page.dialog_open() and page.options() == []
    assert page.el("api-key") == driver.switch_to.active_element
    page.shot("key-prompt")
    page.el("api-key").send_keys("wrong", Keys.ENTER)  # a wrong key: asked again
    page.until(lambda: page.dialog_open() and "not valid" in page.el("key-reason").text)
    page.fill("api-key", KEY)
    page.el("api-key").send_keys(Keys.ENTER)
    assert page.until(page.options) == ["tiny-base", ADAPTER]
    assert not page.dialog_open()
    greedy(page, 6)
    assert page.finished(page.send("Hi"))
    page.el("copy-curl").click()  # the snippet names the key's variable, never the key
    curl = page.until(lambda: page.el("snippet").get_attribute("value"))
    assert "Bearer $FERROLLM_API_KEY" in curl and KEY not in curl
    page.shot("keyed-chat")
    assert console_errors(driver, allowed_statuses=(401,)) == []


def test_the_model_picker_offers_the_loaded_adapters(
    driver: WebDriver, keyed_server: Server, artifacts: Path
) -> None:
    driver.get_log("browser")
    page = Page(driver, keyed_server.url, artifacts)  # the tab kept the key (sessionStorage)
    assert not page.dialog_open()
    assert page.el("model-note").text == "1 LoRA adapter(s) loaded"
    Select(page.el("model")).select_by_value(ADAPTER)
    assert "(LoRA adapter on tiny-base)" in Select(page.el("model")).first_selected_option.text
    greedy(page, 4)
    assert page.finished(page.send("Hi"))
    page.el("copy-curl").click()
    curl = page.until(lambda: page.el("snippet").get_attribute("value"))
    assert json.loads(curl.split("-d '", 1)[1].rstrip("'"))["model"] == ADAPTER
    assert console_errors(driver) == []


@pytest.fixture(scope="module")
def one_seat_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A tiny random model with one seat: every other request waits in the queue."""
    root = tmp_path_factory.mktemp("playground-one-seat")
    base = build_tiny_model("llama3", root / "tiny-one-seat")
    flags = ("--max-model-len", "512", "--kv-cache-memory", "16MiB", "--max-num-seqs", "1")
    with serving(root, str(base), *flags) as server:
        yield server


def test_a_waiting_request_shows_its_place_in_the_queue(
    driver: WebDriver, one_seat_server: Server, artifacts: Path
) -> None:
    """Three long requests hold the one seat in turn; the page's request shows where it
    waits (``X-Ferrollm-Client-Id`` and ``/v1/playground/queue/{id}``) until its first
    token."""
    import threading

    import httpx

    body = {"model": "tiny-one-seat", "prompt": "a b c", "max_tokens": 480, "ignore_eos": True}

    def occupy() -> None:
        httpx.post(f"{one_seat_server.url}/v1/completions", json=body, timeout=WAIT_S)

    holders = [threading.Thread(target=occupy) for _ in range(3)]
    for holder in holders:
        holder.start()
    driver.get_log("browser")
    page = Page(driver, one_seat_server.url, artifacts)
    greedy(page, 4)
    answer = page.send("Hi")
    place = page.until(
        lambda: (
            page.el("queue-wrap").is_displayed()
            and "position" in page.el("queue").text
            and page.el("queue").text
        )
    )
    assert place.startswith("position ")
    assert int(place.split()[1]) >= 1
    page.shot("queue-position")
    assert page.finished(answer) is not None
    assert not page.el("queue-wrap").is_displayed()  # gone with the first token
    for holder in holders:
        holder.join(WAIT_S)
    assert console_errors(driver) == []
