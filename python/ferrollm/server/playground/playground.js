// The ferrollm playground: a chat and a raw-completions client of this server's /v1 routes,
// streamed over SSE, with the request's sampling parameters, log-probability colouring, tools,
// JSON output, media attachments and the request as curl or Python. No dependencies.

import { ServerError, api, asCurl, asPython, events } from "./stream.js";
import {
  appendPiece, appendReasoning, appendToolCalls, chatEntries, completionEntries, hideTip,
  isEmpty, messageView, onTranscriptKey, prettyArguments, showTip,
} from "./transcript.js";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "ferrollm.playground.key";
const MEDIA_PARTS = { image: "image_url", audio: "audio_url", video: "video_url" };

const state = {
  key: sessionStorage.getItem(KEY_STORE) || "",
  cards: [],
  info: null,
  history: [], // chat messages sent so far (answers included)
  attachments: [], // {kind, name, url}
  controller: null, // the AbortController of the request in flight
  last: null, // {mode, path, body} of the last request sent
};

// ---- models, limits and the key ------------------------------------------------------------

async function loadModels() {
  let list;
  try {
    list = await (await api("/v1/models", { key: state.key })).json();
  } catch (e) {
    if (e instanceof ServerError && e.status === 401) return askKey(e.message);
    return showError(e);
  }
  hideError();
  state.cards = list.data;
  const select = $("model");
  select.replaceChildren(
    ...state.cards.map((card) => {
      const label = card.parent ? `${card.id} (LoRA adapter on ${card.parent})` : card.id;
      return new Option(label, card.id);
    }),
  );
  const adapters = state.cards.filter((card) => card.parent).length;
  $("model-note").textContent = adapters ? `${adapters} LoRA adapter(s) loaded` : "";
  showModalities(state.cards[0]?.modalities ?? ["text"]);
  if (state.cards[0]?.task === "embed") {
    showError(new ServerError(0, "this server embeds (--task embed): the playground only generates text"));
  }
  await loadInfo();
}

async function loadInfo() {
  try {
    state.info = await (await api("/v1/playground/info", { key: state.key })).json();
  } catch {
    return; // an older server: the form keeps the documented ranges
  }
  const maxTokens = $("max_tokens");
  maxTokens.max = state.info.max_iter_times;
  maxTokens.placeholder = `${state.info.max_iter_times} (server limit)`;
  $("top_logprobs").max = state.info.max_logprobs;
}

function showModalities(modalities) {
  const kinds = modalities.filter((m) => m in MEDIA_PARTS);
  $("attachments").hidden = kinds.length === 0;
  $("attach").accept = kinds.map((k) => `${k}/*`).join(",");
}

function askKey(reason) {
  $("key-reason").textContent = reason || "This server needs an API key.";
  $("api-key").value = state.key;
  const dialog = $("key-dialog");
  dialog.returnValue = ""; // Escape closes it without a new value
  if (!dialog.open) dialog.showModal();
  $("api-key").focus();
}

function onKeyDialogClose() {
  if ($("key-dialog").returnValue !== "save") return;
  state.key = $("api-key").value.trim();
  sessionStorage.setItem(KEY_STORE, state.key);
  loadModels();
}

// ---- the request ---------------------------------------------------------------------------

const mode = () => ($("mode-completions").checked ? "completions" : "chat");

/** The sampling fields the user filled in (empty fields are left to the server's defaults). */
function samplingFields() {
  const body = {};
  for (const input of document.querySelectorAll("[data-param]")) {
    const raw = input.value.trim();
    if (raw === "") continue;
    const value = Number(raw);
    body[input.dataset.param] = Number.isFinite(value) ? value : raw;
  }
  const stops = $("stop").value.split("\n").filter((s) => s !== "");
  if (stops.length) body.stop = stops;
  if ($("extra").value.trim() !== "") {
    const extra = parseJson("extra", "the extra fields");
    if (extra === null || typeof extra !== "object" || Array.isArray(extra)) {
      throw new ServerError(0, "the extra fields must be a JSON object");
    }
    Object.assign(body, extra);
  }
  return body;
}

function parseJson(id, what) {
  try {
    return JSON.parse($(id).value);
  } catch (e) {
    throw new ServerError(0, `${what} is not valid JSON: ${e.message}`);
  }
}

function formatFields(body) {
  const format = $("response-format").value;
  if (format === "json_object") body.response_format = { type: "json_object" };
  if (format === "json_schema") {
    const schema = parseJson("json-schema", "the JSON schema");
    body.response_format = { type: "json_schema", json_schema: { name: "playground", schema } };
  }
}

function toolFields(body) {
  if ($("tools").value.trim() === "") return;
  body.tools = parseJson("tools", "the tool definitions");
  body.tool_choice = $("tool-choice").value;
}

function userContent(text) {
  if (state.attachments.length === 0) return text;
  const parts = text ? [{ type: "text", text }] : [];
  for (const { kind, url } of state.attachments) {
    parts.push({ type: MEDIA_PARTS[kind], [MEDIA_PARTS[kind]]: { url } });
  }
  return parts;
}

/** {mode, path, body, user} of the request the form describes for prompt `text`. */
function buildRequest(text) {
  const body = { model: $("model").value, ...samplingFields() };
  const logprobs = $("logprobs").checked;
  const top = Number($("top_logprobs").value || 0);
  formatFields(body);
  body.stream = true;
  body.stream_options = { include_usage: true };
  if (mode() === "completions") {
    if (logprobs) body.logprobs = top;
    return { mode: "completions", path: "/v1/completions", body: { prompt: text, ...body } };
  }
  if (logprobs) Object.assign(body, { logprobs: true, top_logprobs: top });
  toolFields(body);
  const system = $("system").value.trim();
  const user = { role: "user", content: userContent(text) };
  const messages = [...(system ? [{ role: "system", content: system }] : []), ...state.history, user];
  return { mode: "chat", path: "/v1/chat/completions", body: { messages, ...body }, user };
}

// ---- sending, streaming and stopping -------------------------------------------------------

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop-button").disabled = !busy;
  document.body.classList.toggle("busy", busy);
}

function attachmentsNote(view) {
  if (state.attachments.length === 0) return;
  const note = document.createElement("p");
  note.className = "note";
  note.textContent = `attached: ${state.attachments.map((a) => a.name).join(", ")}`;
  view.view.append(note);
}

function showError(error) {
  const box = $("error");
  const where = error.param ? ` (${error.param})` : "";
  const status = error.status ? `${error.status}: ` : "";
  box.textContent = `${status}${error.message}${where}`;
  box.hidden = false;
}

function hideError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

class Stats {
  constructor() {
    this.sent = performance.now();
    this.first = null;
    this.tokens = 0;
    for (const id of ["ttft", "tps", "num-tokens", "finish"]) $(id).value = "–";
  }

  add(num) {
    if (num === 0) return;
    const now = performance.now();
    if (this.first === null) {
      this.first = now;
      $("ttft").value = `${Math.round(now - this.sent)} ms`;
      $("queue-wrap").hidden = true;
    }
    this.tokens += num;
    this.show(now);
  }

  show(now, total = this.tokens) {
    $("num-tokens").value = String(total);
    const seconds = (now - this.first) / 1000;
    if (this.first !== null && total > 1 && seconds > 0) {
      $("tps").value = ((total - 1) / seconds).toFixed(1);
    }
  }
}

/** A fresh id for one request (`X-Ferrollm-Client-Id`), so the page can ask where it waits. */
function newClientId() {
  const random = Math.random().toString(36).slice(2, 10);
  return `playground-${Date.now().toString(36)}-${random}`;
}

/** Poll the request's place in the queue while it waits for its first token. */
function watchQueue(stats, clientId, signal) {
  const timer = setInterval(async () => {
    if (stats.first !== null || signal.aborted) return clearInterval(timer);
    try {
      const path = `/v1/playground/queue/${encodeURIComponent(clientId)}`;
      const place = await (await api(path, { key: state.key, signal })).json();
      $("queue").value = place.queue_position === null
        ? `${place.num_waiting} waiting, ${place.num_in_flight} in flight`
        : `position ${place.queue_position} (${place.num_in_flight} in flight)`;
      $("queue-wrap").hidden = stats.first !== null;
    } catch {
      clearInterval(timer);
    }
  }, 500);
  return () => clearInterval(timer);
}

function readChunk(request, view, stats, chunk) {
  if (chunk.err_msg) showError(new ServerError(0, chunk.err_msg));
  if (chunk.usage?.completion_tokens && stats.first !== null) {
    stats.show(performance.now(), chunk.usage.completion_tokens);
  }
  for (const choice of chunk.choices ?? []) {
    let num = 0;
    if (request.mode === "chat") {
      const delta = choice.delta ?? {};
      const entries = chatEntries(choice.logprobs);
      if (delta.reasoning_content) appendReasoning(view, delta.reasoning_content);
      if (delta.content) appendPiece(view, delta.content, entries);
      if (delta.tool_calls) appendToolCalls(view, delta.tool_calls);
      num = entries.length || (delta.content || delta.tool_calls || delta.reasoning_content ? 1 : 0);
    } else {
      const entries = completionEntries(choice.logprobs);
      if (choice.text) appendPiece(view, choice.text, entries);
      num = entries.length || (choice.text ? 1 : 0);
    }
    stats.add(num);
    if (choice.finish_reason) $("finish").value = choice.finish_reason;
  }
}

async function send() {
  if (state.controller) return;
  const text = $("prompt").value;
  if (text.trim() === "" && state.attachments.length === 0) return $("prompt").focus();
  let request;
  try {
    request = buildRequest(text);
  } catch (e) {
    return showError(e);
  }
  hideError();
  state.last = request;
  const asked = messageView(request.mode === "chat" ? "user" : "prompt", text);
  if (request.mode === "chat") attachmentsNote(asked);
  const view = messageView(request.mode === "chat" ? "assistant" : "completion", "");
  view.view.classList.add("streaming");
  $("prompt").value = "";
  if (!(await generate(request, view)) && isEmpty(view)) {
    // Refused before anything came (a 400, a 401): the turn is undone and the text comes back.
    asked.view.remove();
    view.view.remove();
    if ($("prompt").value === "") $("prompt").value = text;
  }
}

/** Stream `request` into `view`; whether it ended without an error (a Stop is no error). */
async function generate(request, view) {
  const controller = (state.controller = new AbortController());
  const stats = new Stats();
  const clientId = newClientId();
  const stopWatching = watchQueue(stats, clientId, controller.signal);
  setBusy(true);
  let stopped = false;
  let failed = false;
  try {
    const response = await api(request.path, {
      key: state.key, body: request.body, signal: controller.signal, clientId,
    });
    for await (const chunk of events(response)) readChunk(request, view, stats, chunk);
  } catch (e) {
    if (e.name === "AbortError") stopped = true;
    else {
      failed = true;
      if (e instanceof ServerError && e.status === 401) askKey(e.message);
      else showError(e);
    }
  } finally {
    stopWatching();
    state.controller = null;
    view.view.classList.remove("streaming");
    if (stopped) {
      view.view.classList.add("stopped");
      $("finish").value = "stopped";
    }
    if (!failed) remember(request, view);
    setBusy(false);
    $("prompt").focus();
  }
  return !failed;
}

/** Keep the turn in the chat history (a stopped answer as far as it went). */
function remember(request, view) {
  if (request.mode !== "chat" || isEmpty(view)) return;
  state.history.push(request.user);
  const answer = { role: "assistant", content: view.content.textContent };
  const calls = view.toolCalls.filter(Boolean);
  if (calls.length) {
    answer.tool_calls = calls.map((c) => ({
      id: c.id, type: "function", function: { name: c.name, arguments: c.arguments },
    }));
    for (const c of calls) prettyArguments(c);
  }
  state.history.push(answer);
  state.attachments = [];
  showAttachments();
}

function stop() {
  state.controller?.abort();
}

function clear() {
  stop();
  state.history = [];
  state.attachments = [];
  showAttachments();
  $("transcript").replaceChildren();
  hideError();
  $("prompt").focus();
}

// ---- attachments, snippets, modes ----------------------------------------------------------

function readAttachments() {
  for (const file of $("attach").files) {
    const kind = file.type.split("/")[0];
    if (!(kind in MEDIA_PARTS)) {
      showError(new ServerError(0, `${file.name}: only image, audio or video files can be attached`));
      continue;
    }
    const reader = new FileReader();
    reader.addEventListener("load", () => {
      state.attachments.push({ kind, name: file.name, url: reader.result });
      showAttachments();
    });
    reader.readAsDataURL(file);
  }
  $("attach").value = "";
}

function showAttachments() {
  $("attached").replaceChildren(
    ...state.attachments.map((a) => {
      const item = document.createElement("li");
      item.textContent = `${a.kind}: ${a.name}`;
      return item;
    }),
  );
}

async function copySnippet(kind) {
  let request = state.last;
  try {
    if (!request || $("prompt").value.trim() !== "") request = buildRequest($("prompt").value);
  } catch (e) {
    return showError(e);
  }
  const origin = location.origin;
  const text = kind === "curl"
    ? asCurl(origin, request.path, request.body, Boolean(state.key))
    : asPython(origin, request.mode, request.body, Boolean(state.key));
  $("snippet-label").textContent = kind === "curl" ? "Request as curl" : "Request as Python (openai SDK)";
  $("snippet").value = text;
  $("snippet-panel").hidden = false;
  const status = $("snippet-status");
  try {
    await navigator.clipboard.writeText(text);
    status.textContent = "Copied to the clipboard.";
  } catch {
    status.textContent = "The clipboard is not available here: select the text and copy it.";
  }
  $("snippet").focus();
  $("snippet").select();
}

function onModeChange() {
  const chat = mode() === "chat";
  document.body.classList.toggle("completions", !chat);
  $("prompt-label").textContent = chat ? "Message" : "Prompt (completed as raw text)";
}

function onFormatChange() {
  const schema = $("response-format").value === "json_schema";
  for (const el of document.querySelectorAll(".schema-only")) el.hidden = !schema;
}

// ---- wiring --------------------------------------------------------------------------------

function onPromptKey(event) {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
}

function onGlobalKey(event) {
  if (event.key === "Escape" && state.controller) {
    event.preventDefault();
    stop();
  }
}

function init() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("settings").addEventListener("submit", (event) => event.preventDefault());
  $("prompt").addEventListener("keydown", onPromptKey);
  document.addEventListener("keydown", onGlobalKey);
  $("stop-button").addEventListener("click", stop);
  $("clear").addEventListener("click", clear);
  $("copy-curl").addEventListener("click", () => copySnippet("curl"));
  $("copy-python").addEventListener("click", () => copySnippet("python"));
  $("snippet-close").addEventListener("click", () => {
    $("snippet-panel").hidden = true;
    $("prompt").focus();
  });
  $("key-button").addEventListener("click", () => askKey("Set the key the playground sends."));
  $("key-dialog").addEventListener("close", onKeyDialogClose);
  $("attach").addEventListener("change", readAttachments);
  for (const radio of document.querySelectorAll("input[name=mode]")) {
    radio.addEventListener("change", onModeChange);
  }
  $("response-format").addEventListener("change", onFormatChange);
  const transcript = $("transcript");
  transcript.addEventListener("keydown", onTranscriptKey);
  transcript.addEventListener("mouseover", showTip);
  transcript.addEventListener("focusin", showTip);
  transcript.addEventListener("mouseout", hideTip);
  transcript.addEventListener("focusout", hideTip);
  onModeChange();
  onFormatChange();
  loadModels();
  $("prompt").focus();
}

init();
