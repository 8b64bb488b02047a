// The page: loads onnxruntime-web, the model, the demo's form (form.json: the labels, defaults and choices of the
// Gradio demo's fields, from demo/form.py) and the request specification (spec.json: the limits and messages),
// reads the form, streams the tokens into the output with live stats, and stops on Stop.
// `window.gptServe` runs the same generation for scripts (the browser test drives it):
//
//   await gptServe.ready;                                   // the model's facts, once it is loaded
//   const r = await gptServe.generate({ prompt: "ROMEO:", maxNewTokens: 300, temperature: 0, windowMode: "refill" });
//   r.ids, r.text, r.tokensPerSecond, r.seed                // every option left out takes the specification's default
//
// URL parameters: ?model=URL of a model folder (default: model/, beside the page), ?onnx=model.onnx for the fp32
// graph instead of the int8 model_quantized.onnx.

import { encodePrompt, generateTokens } from "./engine.js";
import { FieldError, FORM_FIELDS, inputId, readForm } from "./form.js";
import { loadModel, ModelError, ONNX_FILES } from "./model.js";
import { loadJson, loadSpec, parseRequest } from "./spec.js";
import { plural } from "./vocab.js";

const ORT_DIR = new URL("ort/", import.meta.url);
const ORT_MODULE = "ort.wasm.min.mjs"; // onnxruntime-web's WASM-only build; it loads its .wasm from ORT_DIR
const PAINT_INTERVAL_MS = 50; // the least time between two updates of the output (and yields to the page)
const FORM_FILE = new URL("form.json", import.meta.url);
const CHOICE_FIELDS = ["window_mode", "unk_policy"]; // radio buttons, named after the field's input id

const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const modelUrl = query.get("model") ?? "model/";
const onnxFile = query.get("onnx") ?? ONNX_FILES[0];

let current = null; // the running generation: {stop: boolean}
let unkHint; // how the form accepts characters outside the vocabulary, in its control's words (form.json)

async function openModel() {
  let ort;
  try {
    ort = await import(new URL(ORT_MODULE, ORT_DIR).href);
  } catch (e) {
    throw new ModelError(
      `onnxruntime-web is missing: ${new URL(ORT_MODULE, ORT_DIR)} did not load (${e.message}). It comes from npm: ` +
        "run `make install` (or `npm ci` in demo/web) in the repository",
    );
  }
  ort.env.wasm.wasmPaths = ORT_DIR.href;
  ort.env.wasm.numThreads = 1; // a static server sends no cross-origin isolation headers: one thread, everywhere
  return loadModel(ort, modelUrl, onnxFile);
}

/** Lets the page paint and handle clicks (a message task: unlike a timer, not throttled in background tabs). */
function yieldToPage() {
  return new Promise((resolve) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = () => resolve();
    channel.port2.postMessage(null);
  });
}

/**
 * Runs one generation; calls onUpdate(progress) at most every PAINT_INTERVAL_MS and once at the end, with
 * progress = {ids (all new ids so far), tokens, timeToFirstToken (ms), tokensPerSecond, done, stopped}.
 * tokensPerSecond counts the tokens after the first per second after the first, as the server-side demo does.
 */
async function run(model, request, onUpdate = () => {}) {
  if (current) throw new Error("a generation is already running: stop it first");
  const { promptIds, maxNewTokens, sampling, seed, windowMode, refillTokens } = request;
  current = { stop: false };
  const ids = [];
  const start = performance.now();
  let [first, latest, painted] = [null, start, start];
  const progress = (done) => ({
    ids,
    tokens: ids.length,
    seed,
    timeToFirstToken: first === null ? null : first - start,
    tokensPerSecond: ids.length >= 2 && latest > first ? ((ids.length - 1) * 1000) / (latest - first) : null,
    done,
    stopped: current.stop,
  });
  try {
    const tokens = generateTokens(model, promptIds, maxNewTokens, { sampling, seed, windowMode, refillTokens });
    for await (const token of tokens) {
      latest = performance.now();
      first ??= latest;
      ids.push(token);
      if (latest - painted >= PAINT_INTERVAL_MS) {
        onUpdate(progress(false));
        await yieldToPage();
        painted = performance.now();
      }
      if (current.stop) break; // leaving the loop closes the generator: no further forward runs
    }
    const result = progress(true);
    onUpdate(result);
    return result;
  } finally {
    current = null;
  }
}

function formatStats(p, maxNewTokens) {
  const speed = p.tokensPerSecond === null ? "…" : p.tokensPerSecond.toFixed(0);
  const ttft = p.timeToFirstToken === null ? "…" : `${p.timeToFirstToken.toFixed(0)} ms`;
  return `${p.tokens} / ${maxNewTokens} tokens · ${speed} tokens/s · first token ${ttft} · seed ${p.seed}`;
}

function setStatus(text, kind = "") {
  $("status").textContent = text;
  $("status").className = `status ${kind}`;
}

/** The form's texts, by the specification's field names (a choice: the checked radio's value). */
function formFields() {
  const text = (name) =>
    CHOICE_FIELDS.includes(name)
      ? document.querySelector(`input[name=${inputId(name)}]:checked`)?.value
      : $(inputId(name)).value;
  return Object.fromEntries(FORM_FIELDS.map((name) => [name, text(name)]));
}

/** Labels the form's fields, adds the choices' radio buttons and fills in the defaults, as the demo's (form.json). */
function showForm(form) {
  document.querySelectorAll("[data-field]").forEach((el) => (el.textContent = form[el.dataset.field].label));
  unkHint = form.unk_policy.hint;
  for (const name of CHOICE_FIELDS) {
    for (const [label, value] of form[name].choices) {
      const input = Object.assign(document.createElement("input"), { type: "radio", name: inputId(name), value });
      input.checked = value === form[name].default;
      const choice = document.createElement("label");
      choice.append(input, label);
      $(inputId(name)).append(choice);
    }
  }
  for (const name of FORM_FIELDS.filter((n) => !CHOICE_FIELDS.includes(n))) {
    $(inputId(name)).value = String(form[name].default);
  }
}

async function onGenerate(model, spec) {
  document.querySelectorAll(".invalid").forEach((el) => el.classList.remove("invalid"));
  let request;
  try {
    request = readForm(formFields(), spec, model.vocab, unkHint);
  } catch (e) {
    if (!(e instanceof FieldError)) throw e;
    $(e.field)?.classList.add("invalid");
    setStatus(e.message, "error");
    return;
  }
  // the prompt as the model reads it (unknown characters replaced or dropped), as the Python text stream gives it
  $("prompt-echo").textContent = request.prompt && model.vocab.decode(request.promptIds);
  $("generated").textContent = "";
  $("generate-btn").disabled = true;
  $("stop-btn").disabled = false;
  setStatus("Generating…");
  let shown = 0;
  const update = (p) => {
    $("generated").append(model.vocab.decode(p.ids.slice(shown))); // a text node per update: no re-layout of all
    shown = p.ids.length;
    $("stats").textContent = formatStats(p, request.maxNewTokens);
  };
  try {
    const result = await run(model, request, update);
    setStatus(result.stopped ? "Stopped." : "Done.", "done");
  } catch (e) {
    setStatus(e.message, "error");
  } finally {
    $("generate-btn").disabled = false;
    $("stop-btn").disabled = true;
  }
}

// window.gptServe.generate's options -> the specification's field names
const SCRIPT_OPTIONS = {
  prompt: "prompt", maxNewTokens: "max_new_tokens", temperature: "temperature", topK: "top_k", topP: "top_p",
  repetitionPenalty: "repetition_penalty", seed: "seed", windowMode: "window_mode", refillTokens: "refill_tokens",
  unkPolicy: "unk_policy",
};

/** What window.gptServe.generate does: the options as values (parsed by the specification, as a JSON client's
 * would be; promptIds instead of a prompt: ids as they are); returns the result with the text. */
async function generateForScript(model, spec, options) {
  const { promptIds = null, ...rest } = options;
  const unknown = Object.keys(rest).filter((key) => !(key in SCRIPT_OPTIONS));
  if (unknown.length) {
    throw new Error(`unknown options [${unknown}]; the options are [promptIds,${Object.keys(SCRIPT_OPTIONS)}]`);
  }
  const request = parseRequest(spec, Object.fromEntries(Object.entries(rest).map(([k, v]) => [SCRIPT_OPTIONS[k], v])));
  request.promptIds = promptIds ?? encodePrompt(model.vocab, request.prompt, request.unkPolicy);
  const result = await run(model, request);
  return { ...result, ids: [...result.ids], text: model.vocab.decode(result.ids) };
}

function describe(model, seconds) {
  const kind = onnxFile === ONNX_FILES[0] ? "int8" : "fp32";
  return (
    `Model ready (${kind} ONNX from ${model.base}, loaded in ${seconds.toFixed(1)} s): block_size ` +
    `${model.blockSize}, ${plural(model.vocabSize, "character")}, ${plural(model.nLayer, "layer")} × ` +
    `${plural(model.nHead, "head")}; ` +
    "onnxruntime-web, WebAssembly, 1 thread."
  );
}

/** The model's corpus.json (what it was trained on), or null when its folder records none (404). */
async function loadCorpus() {
  const url = new URL("corpus.json", new URL(modelUrl.endsWith("/") ? modelUrl : `${modelUrl}/`, document.baseURI));
  const response = await fetch(url).catch(() => null);
  if (!response?.ok) return null;
  return response.json().catch(() => null);
}

/** Presents the model by its training text: the title, a line under the intro, the default prompt, the examples. */
function showCorpus(corpus) {
  if (!corpus) {
    $("corpus").textContent = "Its folder records no training text (no readable corpus.json).";
    return;
  }
  document.title = `gpt-serve in the browser: Let's build GPT on ${corpus.name}`;
  $("corpus").textContent = `This one was trained on ${corpus.name} (${corpus.description}).`;
  const prompts = corpus.prompts ?? [];
  if (prompts.length) $("prompt").value = prompts[0];
  for (const prompt of prompts) {
    const button = Object.assign(document.createElement("button"), { type: "button", className: "example" });
    button.textContent = prompt.replaceAll("\n", " ↵ ");
    button.addEventListener("click", () => ($("prompt").value = prompt));
    $("examples").append(button);
  }
  $("examples").hidden = !prompts.length;
}

/** The specification (spec.json), the form (form.json) shown. */
async function openSpec() {
  let spec;
  try {
    spec = await loadSpec();
  } catch (e) {
    throw new Error(`The page's request limits could not be loaded: ${e.message}`);
  }
  try {
    showForm(await loadJson(FORM_FILE, "the demo's form"));
  } catch (e) {
    throw new Error(`The page's form could not be loaded: ${e.message}`);
  }
  showCorpus(await loadCorpus()); // after the form's defaults: the model's own prompt replaces form.json's
  $("form").hidden = false;
  return spec;
}

function main() {
  const started = performance.now();
  const ready = Promise.all([
    openModel().catch((e) => {
      throw new Error(`The model could not be loaded: ${e.message}`);
    }),
    openSpec(),
  ]);
  window.gptServe = {
    ready: ready.then(([m]) => ({ blockSize: m.blockSize, vocabSize: m.vocabSize, base: m.base, file: onnxFile })),
    generate: async (options = {}) => generateForScript(...(await ready), options),
    stop: () => current && (current.stop = true),
  };
  window.gptServe.ready.catch(() => {}); // the status line shows the error; a script awaiting `ready` gets it too
  $("stop-btn").addEventListener("click", () => window.gptServe.stop());
  ready.then(
    ([model, spec]) => {
      $("model-status").textContent = describe(model, (performance.now() - started) / 1000);
      $("model-status").className = "status done";
      $("form").addEventListener("submit", (event) => {
        event.preventDefault();
        if (!current) onGenerate(model, spec); // a second click while a run is on does nothing
      });
      $("generate-btn").disabled = false;
    },
    (e) => {
      $("model-status").textContent = e.message;
      $("model-status").className = "status error";
    },
  );
}

main();
