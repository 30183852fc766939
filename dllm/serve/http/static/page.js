// The live page of `dllm serve` (index.html): stream /v1/completions with `dllm_events: true` and draw
// each `dllm.step` event as a canvas of generated positions, coloured by the step that committed them.
// Plain browser JavaScript, no build step. The SSE protocol: docs/guides/serving.md.
"use strict";

const $ = (selector, root = document) => root.querySelector(selector);
const server = { model: null, kind: "diffusion", samplers: [], caches: [], defaults: {} };

// ---------------------------------------------------------------------------------------------
// talking to the server

function headers(extra = {}) {
  const key = $("#api-key").value.trim();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function getJSON(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status} ${await errorText(response)}`);
  return response.json();
}

async function errorText(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    const error = body.error || body;
    return error.param ? `${error.message} (field: ${error.param})` : (error.message || text);
  } catch (_) {
    return text;
  }
}

// Server-sent events of a fetch() response: yields {event, data} (event "message" for plain data lines).
async function* serverEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { event, data: data.join("\n") };
    }
  }
}

// The names of a registry as /v1/dllm/options lists it: ["a", ...], [{name}, ...], [[name, help], ...]
// or {name: {...}}; each with its option fields when the server gives them.
function entries(listing) {
  if (!listing) return [];
  if (!Array.isArray(listing)) return Object.entries(listing).map(([name, info]) => ({ name, ...asInfo(info) }));
  return listing.map((item) => {
    if (typeof item === "string") return { name: item };
    if (Array.isArray(item)) return { name: item[0], help: item[1] };
    return { ...item, name: item.name };
  });
}

function asInfo(info) {
  if (info && typeof info === "object" && !Array.isArray(info)) return info;
  return typeof info === "string" ? { help: info } : {};
}

function optionHint(entry) {
  const fields = entry.options || entry.fields || [];
  const list = Array.isArray(fields) ? fields : Object.entries(fields).map(([name, d]) => ({ name, default: d }));
  return list.map((f) => (typeof f === "string" ? f : `${f.name}=${f.default ?? ""}`)).join(",");
}

async function loadServer() {
  const models = await getJSON("/v1/models");
  server.model = models.data && models.data.length ? models.data[0].id : null;
  try {
    const options = await getJSON("/v1/dllm/options");
    server.kind = options.kind || server.kind;
    server.samplers = entries(options.samplers);
    server.caches = entries(options.caches);
    server.defaults = { max_tokens: options.default_max_tokens, ...(options.defaults || {}) };
  } catch (err) {
    showError($("#watch-run"), `could not read the sampler and cache lists: ${err.message}`);
  }
  $("#model").textContent = `model: ${server.model ?? "?"} (${server.kind})`;
}

// ---------------------------------------------------------------------------------------------
// the settings pickers

function fillSelect(select, items, chosen) {
  select.replaceChildren();
  for (const item of items) {
    const option = document.createElement("option");
    option.value = option.textContent = item.name;
    if (item.help || item.description) option.title = item.help || item.description;
    select.append(option);
  }
  const names = items.map((i) => i.name);
  if (chosen !== undefined && chosen !== null && !names.includes(chosen)) {
    const option = document.createElement("option");
    option.value = option.textContent = chosen;
    select.append(option);
  }
  if (chosen !== undefined && chosen !== null) select.value = chosen;
}

function buildSettings(container, overrides = {}) {
  container.replaceChildren($("#settings-template").content.cloneNode(true));
  const field = (name) => $(`[data-field=${name}]`, container);
  const defaults = { ...server.defaults, ...overrides };
  const [sampler, specOptions] = splitSpec(defaults.sampler);
  fillSelect(field("sampler"), server.samplers, sampler);
  fillSelect(field("cache"), server.caches, defaults.cache);
  // The server's default sampler options (`dllm serve -o NAME=VALUE`) belong to its default sampler; the
  // page names the sampler in every request, which drops them on the server: they must be sent here.
  field("options").value = specOptions || (overrides.sampler ? "" : optionsText(server.defaults.options));
  if (defaults.block_length) field("block_length").value = defaults.block_length;
  if (defaults.max_tokens) field("max_tokens").value = defaults.max_tokens;
  if (typeof defaults.temperature === "number") field("temperature").value = defaults.temperature;
  const hint = () => {
    const entry = server.samplers.find((s) => s.name === field("sampler").value);
    field("options").placeholder = (entry && optionHint(entry)) || "k=v,k=v";
  };
  // Options belong to one sampler (another has other fields): picking another sampler clears them.
  field("sampler").addEventListener("change", () => {
    field("options").value = "";
    hint();
  });
  hint();
  if (server.kind !== "diffusion") {  // a speculative server takes none of the diffusion fields
    for (const name of ["sampler", "options", "cache", "block_length"]) field(name).closest("label").hidden = true;
  }
}

// {name: value} (the server's default sampler options) as the options field's "k=v,k=v".
function optionsText(options) {
  if (!options || typeof options !== "object") return "";
  return Object.entries(options).map(([k, v]) => `${k}=${typeof v === "string" && v.includes(",") ? `(${v})` : v}`)
    .join(",");
}

function splitSpec(spec) {
  if (!spec) return [undefined, ""];
  const at = spec.indexOf(":");
  return at < 0 ? [spec, ""] : [spec.slice(0, at), spec.slice(at + 1)];
}

// The request body of one run: the OpenAI fields and dllm's extra fields (sampler, cache, block_length).
function requestBody(container, prompt) {
  const value = (name) => $(`[data-field=${name}]`, container).value.trim();
  const body = { model: server.model, prompt, stream: true, max_tokens: Number(value("max_tokens")),
                 temperature: Number(value("temperature") || 0) };
  if (server.kind !== "diffusion") body.stream_options = { include_usage: true };  // tokens/s from usage
  if (server.kind === "diffusion") {
    body.dllm_events = true;
    body.sampler = value("options") ? `${value("sampler")}:${value("options")}` : value("sampler");
    body.cache = value("cache");
    if (value("block_length")) body.block_length = Number(value("block_length"));
  }
  return body;
}

// ---------------------------------------------------------------------------------------------
// one run: its canvas, text and numbers

class RunView {
  constructor(root) {
    this.root = root;
    root.replaceChildren($("#run-template").content.cloneNode(true));
    this.canvas = $("[data-role=canvas]", root);
    this.text = $("[data-role=text]", root);
    this.error = $("[data-role=error]", root);
    if (server.kind !== "diffusion") {  // a speculative server streams one delta per verification round
      $("[data-role=legend]", root).textContent = "one box per verification round; colour: the round (∎: end of text)";
    }
  }

  stat(name, value) { $(`[data-stat=${name}]`, this.root).textContent = value; }

  start() {
    this.started = performance.now();
    this.firstText = null;
    this.canvas.replaceChildren();
    this.text.textContent = "";
    this.error.textContent = "";
    for (const name of ["steps", "nfe", "tpf", "tps", "ttft"]) this.stat(name, "–");
    this.setState("running");
  }

  setState(state) {
    this.root.dataset.state = state;
    this.stat("status", state);
  }

  // One denoising step: tokens[i] (null: masked), trace[i] (the committing step, -1: masked).
  step(event) {
    const { tokens, trace, committed } = event;
    while (this.canvas.children.length < tokens.length) {
      const cell = document.createElement("span");
      cell.className = "cell masked";
      this.canvas.append(cell);
    }
    const last = Math.max(1, ...trace);
    const fresh = new Set(committed);
    let done = 0;
    tokens.forEach((token, i) => {
      const cell = this.canvas.children[i];
      const masked = token === null || trace[i] < 0;
      done += masked ? 0 : 1;
      // a special token (EOS, padding) decodes to "" or to its bracketed name
      const special = !masked && (token === "" || /^\[.*\]$|^<.*>$/.test(token.trim()));
      cell.className = "cell" + (masked ? " masked" : "") + (fresh.has(i) ? " fresh" : "") + (special ? " special" : "");
      cell.textContent = masked ? "·" : token === "" ? "∎" : (token.trim() || "␣");
      cell.style.background = masked ? "" : stepColour(trace[i] / last);
      cell.title = masked ? `position ${i}: masked` : `position ${i}: committed at step ${trace[i]}`;
    });
    const seconds = (performance.now() - this.started) / 1000;
    this.stat("steps", event.step + 1);
    this.stat("nfe", event.nfe);
    this.stat("tpf", event.nfe ? (done / event.nfe).toFixed(2) : "–");
    this.stat("tps", seconds > 0 ? (done / seconds).toFixed(1) : "–");
  }

  delta(text) {
    if (text && this.firstText === null) this.firstText = (performance.now() - this.started) / 1000;
    this.text.textContent += text;
    if (server.kind !== "diffusion" && text) this.round(text);
  }

  // Speculative decoding: the text a verification round accepted, one box per round.
  round(text) {
    const cell = document.createElement("span");
    cell.textContent = text.trim() || "␣";
    this.canvas.append(cell);
    const rounds = this.canvas.children.length;
    Array.from(this.canvas.children).forEach((c, i) => {
      c.className = "cell" + (i === rounds - 1 ? " fresh" : "");
      c.style.background = stepColour(i / Math.max(1, rounds - 1));
      c.title = `round ${i + 1}`;
    });
    this.stat("steps", rounds);
  }

  done(event) {
    this.stat("nfe", event.nfe);
    this.stat("tpf", Number(event.tokens_per_forward).toFixed(2));
    this.stat("tps", Number(event.tokens_per_s).toFixed(1));
    const ttft = event.ttft_s ?? this.firstText;
    this.stat("ttft", ttft === null || ttft === undefined ? "–" : `${(1000 * ttft).toFixed(0)} ms`);
  }

  // The usage chunk (speculative servers: no dllm.done event): tokens/s and tokens per round, one target
  // forward verifying each round's draft.
  usage(usage) {
    const rounds = this.canvas.children.length;
    const seconds = (performance.now() - this.started) / 1000;
    if (server.kind === "diffusion" || !usage.completion_tokens) return;
    this.stat("tps", (usage.completion_tokens / seconds).toFixed(1));
    if (rounds) this.stat("tpf", (usage.completion_tokens / rounds).toFixed(2));
  }

  finish() {
    if (this.firstText !== null && $("[data-stat=ttft]", this.root).textContent === "–") {
      this.stat("ttft", `${(1000 * this.firstText).toFixed(0)} ms`);
    }
    this.setState("done");
  }

  fail(message) {
    this.error.textContent = message;
    this.setState("error");
  }
}

// Blue (first step) through green and yellow to red (last step).
function stepColour(fraction) {
  const f = Math.min(1, Math.max(0, fraction));
  return `hsl(${Math.round(220 - 220 * f)} 72% ${Math.round(68 - 10 * Math.sin(Math.PI * f))}%)`;
}

function showError(root, message) {
  const view = root.view || (root.view = new RunView(root));
  view.fail(message);
}

async function run(view, body) {
  view.start();
  try {
    const response = await fetch("/v1/completions", {
      method: "POST", headers: headers({ "Content-Type": "application/json" }), body: JSON.stringify(body),
    });
    if (!response.ok) throw new Error(`HTTP ${response.status}: ${await errorText(response)}`);
    for await (const { event, data } of serverEvents(response)) {
      if (data === "[DONE]") break;
      const payload = JSON.parse(data);
      if (event === "dllm.step") view.step(payload);
      else if (event === "dllm.done") view.done(payload);
      else if (payload.error) throw new Error(payload.error.message || JSON.stringify(payload.error));
      else if (payload.choices && payload.choices.length) view.delta(payload.choices[0].text || "");
      if (payload.usage) view.usage(payload.usage);
    }
    view.finish();
  } catch (err) {
    view.fail(err.message);
  }
}

// ---------------------------------------------------------------------------------------------
// wiring

function busy(button, on) { button.disabled = on; }

function setUp() {
  for (const tab of document.querySelectorAll(".tab")) {
    tab.addEventListener("click", () => {
      for (const t of document.querySelectorAll(".tab")) t.classList.toggle("active", t === tab);
      for (const p of document.querySelectorAll(".pane")) p.classList.toggle("active", p.id === `pane-${tab.dataset.tab}`);
    });
  }
  buildSettings($("#watch-settings"));
  buildSettings($("#a-settings"));
  const other = server.samplers.map((s) => s.name).find((n) => n === "threshold")
    || (server.samplers[1] && server.samplers[1].name);
  buildSettings($("#b-settings"), other ? { sampler: other } : {});
  const watch = $("#watch-run");
  watch.view = new RunView(watch);
  const a = $("#a-run"), b = $("#b-run");
  a.view = new RunView(a);
  b.view = new RunView(b);

  $("#watch-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    busy($("#run"), true);
    await run(watch.view, requestBody($("#watch-settings"), $("#prompt").value));
    busy($("#run"), false);
  });
  $("#compare-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    busy($("#cmp-run"), true);
    const prompt = $("#cmp-prompt").value;
    await Promise.all([run(a.view, requestBody($("#a-settings"), prompt)),
                       run(b.view, requestBody($("#b-settings"), prompt))]);
    busy($("#cmp-run"), false);
  });
}

async function main() {
  try {
    await loadServer();
    setUp();
    document.body.dataset.state = "ready";
  } catch (err) {
    document.body.dataset.state = "error";
    showError($("#watch-run"), `the server did not answer: ${err.message}`);
  }
}

$("#api-key").addEventListener("change", () => { if (document.body.dataset.state === "error") main(); });
main();
