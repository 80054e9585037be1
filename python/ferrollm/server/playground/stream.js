// The playground's talk with the server: authorised fetches, the SSE reader, the server's
// error messages, and a request written out as curl or as the openai SDK's Python.

/** An error the server answered with (a status and its error body's message). */
export class ServerError extends Error {
  constructor(status, message, param) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

/** fetch() with the key (when one is set) as a Bearer token and JSON bodies. */
export async function api(path, { key, body, signal, clientId } = {}) {
  const headers = {};
  if (key) headers.Authorization = `Bearer ${key}`;
  if (clientId) headers["X-Ferrollm-Client-Id"] = clientId;
  const init = { method: body === undefined ? "GET" : "POST", headers, signal };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await serverError(response);
  return response;
}

/** The ServerError of a non-2xx response: the message of its error body, whatever the shape
 * (OpenAI `{"error": {"message"}}`, MindIE `{"error": "..."}`), else the status text. */
async function serverError(response) {
  let message = `${response.status} ${response.statusText}`;
  let param = null;
  try {
    const body = await response.json();
    const error = body.error ?? body;
    if (typeof error === "string") message = error;
    else if (error && typeof error.message === "string") {
      message = error.message;
      param = error.param ?? null;
    }
  } catch {
    // not JSON: keep the status line
  }
  return new ServerError(response.status, message, param);
}

/** The `data:` payloads of a text/event-stream body, parsed as JSON, until `[DONE]`. */
export async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") return;
          yield JSON.parse(data);
        }
      }
    }
  } finally {
    reader.releaseLock();
  }
}

/** Single-quote `text` for a POSIX shell. */
function shellQuote(text) {
  return `'${text.replaceAll("'", "'\\''")}'`;
}

/** `value` (a JSON value) as a Python literal. */
function py(value, indent = "") {
  if (value === null) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number" || typeof value === "string") return JSON.stringify(value);
  const inner = `${indent}    `;
  if (Array.isArray(value)) {
    if (value.length === 0) return "[]";
    return `[\n${value.map((v) => inner + py(v, inner)).join(",\n")},\n${indent}]`;
  }
  const entries = Object.entries(value);
  if (entries.length === 0) return "{}";
  const items = entries.map(([k, v]) => `${inner}${JSON.stringify(k)}: ${py(v, inner)}`);
  return `{\n${items.join(",\n")},\n${indent}}`;
}

/** The request as a curl command; the key, if any, comes from $FERROLLM_API_KEY. */
export function asCurl(origin, path, body, hasKey) {
  const lines = [`curl ${origin}${path}`, "  -H 'Content-Type: application/json'"];
  if (hasKey) lines.push('  -H "Authorization: Bearer $FERROLLM_API_KEY"');
  if (body.stream) lines[0] += " -N";
  lines.push(`  -d ${shellQuote(JSON.stringify(body, null, 2))}`);
  return lines.join(" \\\n");
}

// The keyword arguments the openai SDK's create() takes; the others go in extra_body.
const SDK_ARGS = {
  chat: new Set([
    "model", "messages", "temperature", "top_p", "max_tokens", "seed", "stop",
    "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "tools",
    "tool_choice", "response_format", "stream", "stream_options", "n",
  ]),
  completions: new Set([
    "model", "prompt", "temperature", "top_p", "max_tokens", "seed", "stop",
    "presence_penalty", "frequency_penalty", "logprobs", "stream", "stream_options", "n",
  ]),
};

/** The request as Python with the openai SDK; the key, if any, from $FERROLLM_API_KEY. */
export function asPython(origin, mode, body, hasKey) {
  const key = hasKey ? 'os.environ["FERROLLM_API_KEY"]' : '"unused"';
  const args = [];
  const extra = {};
  for (const [name, value] of Object.entries(body)) {
    if (SDK_ARGS[mode].has(name)) args.push(`    ${name}=${py(value, "    ")},`);
    else extra[name] = value;
  }
  if (Object.keys(extra).length) args.push(`    extra_body=${py(extra, "    ")},`);
  const call = mode === "chat" ? "client.chat.completions.create" : "client.completions.create";
  const piece = mode === "chat" ? "chunk.choices[0].delta.content or \"\"" : "chunk.choices[0].text";
  const out = body.stream
    ? [`for chunk in response:`, `    if chunk.choices:`, `        print(${piece}, end="", flush=True)`, "print()"]
    : [mode === "chat" ? "print(response.choices[0].message)" : "print(response.choices[0].text)"];
  return [
    ...(hasKey ? ["import os", ""] : []),
    "from openai import OpenAI",
    "",
    `client = OpenAI(base_url="${origin}/v1", api_key=${key})`,
    `response = ${call}(`,
    ...args,
    ")",
    ...out,
  ].join("\n");
}
