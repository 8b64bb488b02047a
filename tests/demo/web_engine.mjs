// The browser page's modules under Node, for tests/demo/test_web_engine.py: the form (form.js, with the request
// specification spec.json), the engine (engine.js) on the model (model.js) run by onnxruntime-web's WebAssembly
// build, the same one the page loads. No DOM, no browser: the files are read from disk instead of fetched.
//
//   node tests/demo/web_engine.mjs CASES.json > RESULTS.json
//
// CASES.json: {model_dir, onnx_file ("onnx/model.onnx"), forms: [{name, fields}], runs: [{name, fields}]}, each
// `fields` the form's texts by the specification's names. RESULTS.json: {constants, forms: {name: {field, message}
// or {request}}, runs: {name: {promptIds, ids} or {field, message}}}; a run is the page's greedy generation of its
// fields (readForm, then generateTokens).

import { readFileSync } from "node:fs";

const WEB = new URL("../../demo/web/", import.meta.url);
const ORT_MODULE = new URL("node_modules/onnxruntime-web/dist/ort.wasm.min.mjs", WEB); // the page's ort/ folder

const { generateTokens, UNK_HINT, WINDOW_MODES } = await import(new URL("engine.js", WEB));
const { FieldError, readForm } = await import(new URL("form.js", WEB));
const model = await import(new URL("model.js", WEB));
const { CharVocab, UNK_POLICIES } = await import(new URL("vocab.js", WEB));

const input = JSON.parse(readFileSync(process.argv[2], "utf-8"));
const spec = JSON.parse(readFileSync(new URL("spec.json", WEB), "utf-8"));
const unkHint = JSON.parse(readFileSync(new URL("form.json", WEB), "utf-8")).unk_policy.hint; // as app.js reads it
const folder = `${input.model_dir}/`;
const readJSON = (name) => JSON.parse(readFileSync(folder + name, "utf-8"));
const vocab = CharVocab.fromJSON(readJSON("vocab.json"));

/** What the form makes of `fields`: the request, or the FieldError's input and message. */
function read(fields) {
  try {
    return { request: readForm(fields, spec, vocab, unkHint) };
  } catch (e) {
    if (!(e instanceof FieldError)) throw e;
    return { field: e.field, message: e.message };
  }
}

async function openModel() {
  const ort = await import(ORT_MODULE);
  ort.env.wasm.numThreads = 1; // as the page runs it
  const bytes = new Uint8Array(readFileSync(folder + input.onnx_file));
  const config = readJSON("config.json");
  return model.OnnxModel.create(ort, { config, vocab, bytes, base: folder, file: input.onnx_file });
}

const forms = Object.fromEntries(input.forms.map(({ name, fields }) => [name, read(fields)]));
const runs = {};
if (input.runs.length) {
  const onnx = await openModel();
  for (const { name, fields } of input.runs) {
    const { request, ...refused } = read(fields);
    if (!request) {
      runs[name] = refused;
      continue;
    }
    const ids = [];
    const options = { sampling: request.sampling, seed: request.seed, windowMode: request.windowMode };
    for await (const token of generateTokens(onnx, request.promptIds, request.maxNewTokens, options)) ids.push(token);
    runs[name] = { promptIds: request.promptIds, ids };
  }
}
const constants = {
  WINDOW_MODES, UNK_POLICIES, UNK_HINT, ONNX_SUBDIR: model.ONNX_SUBDIR, ONNX_FILES: model.ONNX_FILES,
  INPUT_NAMES: model.INPUT_NAMES, LOGITS_NAME: model.LOGITS_NAME, ONNX_FORMAT: model.ONNX_FORMAT,
  ONNX_FORMAT_VERSION: model.ONNX_FORMAT_VERSION, REQUIRED_METADATA: model.REQUIRED_METADATA,
  pastNames: model.pastNames(2), presentNames: model.presentNames(2),
};
process.stdout.write(JSON.stringify({ constants, forms, runs }));
