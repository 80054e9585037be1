// The transcript: one article per message; streamed pieces as text, or as tokens coloured by
// log probability (one tab stop per message, arrows between tokens, a tooltip of the
// alternatives on hover and focus); tool calls as they stream, then parsed.

const $ = (id) => document.getElementById(id);

/** Whether nothing (no text, no tool call) has arrived in `view`. */
export const isEmpty = (view) => view.content.textContent === "" && view.toolCalls.length === 0;

export function messageView(role, text) {
  const view = document.createElement("article");
  view.className = `msg ${role}`;
  const label = document.createElement("h2");
  label.className = "role";
  label.textContent = role;
  const content = document.createElement("div");
  content.className = "content";
  if (text) content.textContent = text;
  view.append(label, content);
  $("transcript").append(view);
  return { view, content, toolCalls: [], reasoning: null, tokens: 0 };
}

/** `entries`: [{token, logprob, top: [{token, logprob}]}] of the tokens of one piece. */
export function appendPiece(view, text, entries) {
  if (!entries || entries.length === 0) {
    view.content.append(text);
    return;
  }
  const span = document.createElement("span");
  span.className = "tok";
  span.textContent = text;
  const worst = Math.min(...entries.map((e) => e.logprob));
  span.dataset.logprob = worst.toFixed(4);
  span.style.setProperty("--p", Math.exp(worst).toFixed(3));
  span.title = entries.map(describeToken).join("\n\n");
  span.tabIndex = view.content.querySelector(".tok") ? -1 : 0;
  view.content.append(span);
}

function describeToken(entry) {
  const pct = (lp) => `${(100 * Math.exp(lp)).toFixed(1)}%`;
  const lines = [`${JSON.stringify(entry.token)}  ${pct(entry.logprob)} (logprob ${entry.logprob.toFixed(3)})`];
  for (const alt of entry.top) lines.push(`  ${JSON.stringify(alt.token)}  ${pct(alt.logprob)}`);
  return lines.join("\n");
}

export function chatEntries(logprobs) {
  return (logprobs?.content ?? []).map((e) => ({
    token: e.token,
    logprob: e.logprob,
    top: (e.top_logprobs ?? []).map((t) => ({ token: t.token, logprob: t.logprob })),
  }));
}

export function completionEntries(logprobs) {
  if (!logprobs?.tokens) return [];
  return logprobs.tokens.map((token, i) => ({
    token,
    logprob: logprobs.token_logprobs[i] ?? 0,
    top: Object.entries(logprobs.top_logprobs?.[i] ?? {}).map(([t, lp]) => ({ token: t, logprob: lp })),
  }));
}

export function appendToolCalls(view, deltas) {
  for (const delta of deltas) {
    const index = delta.index ?? 0;
    let call = view.toolCalls[index];
    if (!call) {
      const box = document.createElement("div");
      box.className = "tool-call";
      const name = document.createElement("span");
      name.className = "tool-name";
      const args = document.createElement("pre");
      args.className = "tool-args";
      box.append("tool call ", name, args);
      view.view.append(box);
      call = view.toolCalls[index] = { id: "", name: "", arguments: "", box, nameEl: name, argsEl: args };
    }
    if (delta.id) call.id = delta.id;
    if (delta.function?.name) call.name += delta.function.name;
    if (delta.function?.arguments) call.arguments += delta.function.arguments;
    call.nameEl.textContent = call.name;
    call.argsEl.textContent = call.arguments;
  }
}

export function appendReasoning(view, text) {
  if (!view.reasoning) {
    const details = document.createElement("details");
    details.className = "reasoning";
    const summary = document.createElement("summary");
    summary.textContent = "reasoning";
    view.reasoning = document.createElement("div");
    details.append(summary, view.reasoning);
    view.content.before(details);
  }
  view.reasoning.append(text);
}

/** Arrow keys move between the tokens of a message (one tab stop per message). */
export function onTranscriptKey(event) {
  const tok = event.target.closest?.(".tok");
  if (!tok || !["ArrowLeft", "ArrowRight", "Home", "End"].includes(event.key)) return;
  const toks = [...tok.parentElement.querySelectorAll(".tok")];
  const at = toks.indexOf(tok);
  const to = { ArrowLeft: at - 1, ArrowRight: at + 1, Home: 0, End: toks.length - 1 }[event.key];
  const next = toks[Math.max(0, Math.min(toks.length - 1, to))];
  tok.tabIndex = -1;
  next.tabIndex = 0;
  next.focus();
  event.preventDefault();
}

export function showTip(event) {
  const tok = event.target.closest?.(".tok");
  const tip = $("tok-tip");
  if (!tok) return;
  tip.textContent = tok.title;
  tip.hidden = false;
  const box = tok.getBoundingClientRect();
  tip.style.left = `${Math.max(4, Math.min(box.left, innerWidth - tip.offsetWidth - 4))}px`;
  tip.style.top = `${box.bottom + 6 + scrollY}px`;
  tok.setAttribute("aria-describedby", "tok-tip");
}

export function hideTip(event) {
  event.target.closest?.(".tok")?.removeAttribute("aria-describedby");
  $("tok-tip").hidden = true;
}

export function prettyArguments(call) {
  try {
    call.argsEl.textContent = JSON.stringify(JSON.parse(call.arguments), null, 2);
  } catch {
    call.box.classList.add("unparsed"); // shown as the model wrote them
  }
}
