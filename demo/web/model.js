// The ONNX model for the engine, run by onnxruntime-web: gpt_serve/generation/backends/onnx_backend.py in the browser.
//
// A model folder (URL) holds config.json, vocab.json and onnx/model_quantized.onnx (the int8 graph that
// `python -m export` writes). The graph is a decoder with an explicit KV cache, in Hugging Face's layout:
//   in:  input_ids (1, T) int64, attention_mask (1, past + T) int64, position_ids (1, T) int64,
//        past_key_values.{i}.key / .value (1, n_head, past, head_size) float32
//   out: logits (1, T, vocab) float32, present.{i}.key / .value (1, n_head, past + T, head_size)
// One graph serves prefill (an empty past, of shape (1, n_head, 0, head_size)) and decode. The file's metadata
// (ONNX `metadata_props`) holds block_size and the other facts checked here, as the Python backend checks them.

import { CharVocab } from "./vocab.js";

export const ONNX_SUBDIR = "onnx/";
export const ONNX_FILES = ["model_quantized.onnx", "model.onnx"]; // int8 (the default) and fp32, as exported
export const INPUT_NAMES = ["input_ids", "attention_mask", "position_ids"];
export const LOGITS_NAME = "logits";
export const ONNX_FORMAT = "chargpt-decoder-with-past";
export const ONNX_FORMAT_VERSION = "1";
export const REQUIRED_METADATA = [
  "format", "format_version", "exporter_version", "block_size", "vocab_size", "vocab_sha256", "n_layer", "n_head",
  "head_size",
];
// config.json entries that must agree with the ONNX metadata (a stale export of an older architecture)
const CONFIG_KEYS_CHECKED = ["block_size", "vocab_size", "n_layer", "n_head"];
const EXPORT_HINT = "export it again with `python -m export MODEL_DIR` (or `gpt-serve export MODEL_DIR`)";

/** Cache inputs in graph order: past_key_values.0.key, past_key_values.0.value, past_key_values.1.key, ... */
export const pastNames = (nLayer) =>
  Array.from({ length: nLayer }, (_, i) => [`past_key_values.${i}.key`, `past_key_values.${i}.value`]).flat();
/** Cache outputs in graph order, matching pastNames: present.0.key, present.0.value, ... */
export const presentNames = (nLayer) =>
  Array.from({ length: nLayer }, (_, i) => [`present.${i}.key`, `present.${i}.value`]).flat();

export class ModelError extends Error {
  name = "ModelError";
}

/** Fetches a model folder's config.json, vocab.json and onnx/`onnxFile` from `modelUrl` (relative to the page)
 * and opens the model. */
export async function loadModel(ort, modelUrl, onnxFile = ONNX_FILES[0]) {
  if (!ONNX_FILES.includes(onnxFile)) {
    throw new ModelError(`the ONNX file must be one of ${ONNX_FILES.join(", ")} (?onnx=...), got '${onnxFile}'`);
  }
  let base;
  try {
    base = new URL(modelUrl.endsWith("/") ? modelUrl : `${modelUrl}/`, document.baseURI);
  } catch {
    throw new ModelError(`?model= must be the URL of a model folder, got '${modelUrl}'`);
  }
  const file = ONNX_SUBDIR + onnxFile;
  // fetched at once; a failure is reported in this order (config first), not by which answer came back first
  const settled = await Promise.allSettled([
    fetchFile(base, "config.json", file).then(parseJSON),
    fetchFile(base, "vocab.json", file).then(parseJSON),
    fetchFile(base, file, file).then(async (r) => new Uint8Array(await r.arrayBuffer())),
  ]);
  const failed = settled.find((result) => result.status === "rejected");
  if (failed) throw failed.reason;
  const [config, vocabJson, bytes] = settled.map((result) => result.value);
  const vocab = CharVocab.fromJSON(vocabJson, `${base}vocab.json`);
  return OnnxModel.create(ort, { config, vocab, bytes, base, file });
}

async function fetchFile(base, name, onnxFile) {
  const url = new URL(name, base);
  let response;
  try {
    response = await fetch(url);
  } catch (e) {
    throw new ModelError(
      `cannot fetch ${url} (${e.message}): is the server up? (a model on another site must allow this page by CORS)`,
    );
  }
  if (!response.ok) {
    throw new ModelError(
      `${url} answered ${response.status} ${response.statusText}: the model folder ${base} must hold ` +
        `config.json, vocab.json and ${onnxFile} (choose the folder with ?model=URL)`,
    );
  }
  return response;
}

async function parseJSON(response) {
  try {
    return await response.json();
  } catch (e) {
    throw new ModelError(`${response.url} is not valid JSON (${e.message})`);
  }
}

/** The ONNX file's metadata_props as an object, read straight from its protobuf bytes (onnxruntime-web does not
 * expose them). Walks the top-level fields of ModelProto; metadata_props is field 14, each entry a
 * StringStringEntryProto (key = field 1, value = field 2). */
export function readMetadata(bytes) {
  const metadata = {};
  for (const [field, value] of protobufFields(bytes)) {
    if (field !== 14) continue;
    let key = "";
    let text = "";
    for (const [f, v] of protobufFields(value)) {
      if (f === 1) key = new TextDecoder().decode(v);
      if (f === 2) text = new TextDecoder().decode(v);
    }
    metadata[key] = text;
  }
  return metadata;
}

/** [field number, value] of each field of a protobuf message: length-delimited values as byte views, the
 * other wire types (varint, fixed64, fixed32) as null. Throws on bytes that are not a protobuf message. */
function* protobufFields(bytes) {
  const notProtobuf = () => new Error("the file is not an ONNX model (not a protobuf message, or truncated)");
  let pos = 0;
  const varint = () => {
    let result = 0;
    for (let scale = 1; scale < 2 ** 64; scale *= 128) {
      if (pos >= bytes.length) throw notProtobuf();
      const byte = bytes[pos++];
      result += (byte & 0x7f) * scale;
      if (byte < 0x80) return result;
    }
    throw notProtobuf();
  };
  while (pos < bytes.length) {
    const tag = varint();
    const [field, wireType] = [Math.floor(tag / 8), tag % 8];
    let value = null;
    if (wireType === 0) varint();
    else if (wireType === 1) pos += 8;
    else if (wireType === 5) pos += 4;
    else if (wireType === 2) {
      const length = varint();
      value = bytes.subarray(pos, pos + length);
      pos += length;
    } else throw notProtobuf();
    if (pos > bytes.length) throw notProtobuf();
    yield [field, value];
  }
}

export class OnnxModel {
  /** Checks the files against each other (as OnnxBackend does), then opens an onnxruntime-web session on the
   * WASM backend. `base` is the folder's URL and `file` the ONNX file's path in it, for messages. */
  static async create(ort, { config, vocab, bytes, base, file = ONNX_SUBDIR + ONNX_FILES[0] }) {
    const where = `${base}${file}`;
    if (!config || typeof config !== "object" || Array.isArray(config)) {
      const got = JSON.stringify(config);
      throw new ModelError(`${base}config.json must hold a model's config (a JSON object), got ${got}`);
    }
    let metadata;
    try {
      metadata = readMetadata(bytes);
    } catch (e) {
      throw new ModelError(`${where}: ${e.message}`);
    }
    const missing = REQUIRED_METADATA.filter((k) => !(k in metadata));
    if (missing.length) {
      throw new ModelError(
        `${where} lacks the metadata [${missing.join(", ")}] that \`python -m export\` writes (block size, ` +
          `vocabulary hash, ...): it was not exported by gpt-serve; ${EXPORT_HINT}`,
      );
    }
    if (metadata.format !== ONNX_FORMAT || metadata.format_version !== ONNX_FORMAT_VERSION) {
      throw new ModelError(
        `${where} has ONNX format '${metadata.format}' version '${metadata.format_version}'; this page reads ` +
          `'${ONNX_FORMAT}' version '${ONNX_FORMAT_VERSION}': ${EXPORT_HINT}`,
      );
    }
    const sizes = {};
    for (const key of ["block_size", "vocab_size", "n_layer", "n_head", "head_size"]) {
      sizes[key] = Number(metadata[key]);
      if (!Number.isSafeInteger(sizes[key]) || sizes[key] < 1) {
        throw new ModelError(`${where}: the metadata's ${key} must be a positive integer, got '${metadata[key]}'`);
      }
    }
    if (vocab.size !== sizes.vocab_size) {
      throw new ModelError(
        `vocabulary mismatch: ${base}vocab.json has ${vocab.size} characters but ${where} was exported with a ` +
          `${sizes.vocab_size}-character vocabulary: use the vocab.json the model was trained with`,
      );
    }
    const sha256 = await vocab.sha256(); // null outside a secure context: the size check above still holds
    if (sha256 !== null && sha256 !== metadata.vocab_sha256) {
      throw new ModelError(
        `vocabulary mismatch: ${base}vocab.json (sha256 ${sha256.slice(0, 12)}...) is not the vocabulary ${where} ` +
          `was exported with (sha256 ${metadata.vocab_sha256.slice(0, 12)}...): the ids would decode to the wrong ` +
          "characters",
      );
    }
    const stale = CONFIG_KEYS_CHECKED.filter((k) => config[k] !== sizes[k]);
    if (stale.length) {
      const shown = stale.map((k) => `${k}: config.json ${config[k]}, ONNX ${sizes[k]}`).join(", ");
      throw new ModelError(`${where} does not match ${base}config.json (${shown}): a stale export; ${EXPORT_HINT}`);
    }
    let session;
    try {
      session = await ort.InferenceSession.create(bytes, {
        executionProviders: ["wasm"],
        graphOptimizationLevel: "all",
        // The int8 file's weights are int8, each read through a DequantizeLinear: folded into fp32 weights once,
        // at load, instead of fused into onnxruntime-web's int8 MatMulNBits kernel (~3x slower in WebAssembly
        // here). The arithmetic is then the fp32 graph's: the Python engine's tokens, OnnxBackend(...,
        // int8_compute=False, inplace=False). No effect on the fp32 file.
        extra: { session: { disable_quant_qdq: "1" } },
      });
    } catch (e) {
      throw new ModelError(`onnxruntime-web cannot load ${where} (${bytes.length} bytes): ${e.message}`);
    }
    const model = new OnnxModel(ort, session, sizes, vocab, metadata);
    model.base = String(base);
    model.checkGraphIO(where);
    return model;
  }

  constructor(ort, session, sizes, vocab, metadata) {
    this.ort = ort;
    this.session = session;
    this.blockSize = sizes.block_size;
    this.vocabSize = sizes.vocab_size;
    this.nLayer = sizes.n_layer;
    this.nHead = sizes.n_head;
    this.headSize = sizes.head_size;
    this.vocab = vocab;
    this.metadata = metadata;
    this.pastNames = pastNames(this.nLayer);
    this.presentNames = presentNames(this.nLayer);
    const empty = new ort.Tensor("float32", new Float32Array(0), [1, this.nHead, 0, this.headSize]);
    this.emptyPast = this.pastNames.map(() => empty);
  }

  checkGraphIO(where) {
    const inputs = [...this.session.inputNames].sort();
    const outputs = [...this.session.outputNames];
    const expectedInputs = [...INPUT_NAMES, ...this.pastNames].sort();
    const expectedOutputs = [LOGITS_NAME, ...this.presentNames];
    if (inputs.join() !== expectedInputs.join() || outputs.join() !== expectedOutputs.join()) {
      throw new ModelError(
        `${where} has inputs [${inputs}] and outputs [${outputs}]; expected inputs [${expectedInputs}] and ` +
          `outputs [${expectedOutputs}]`,
      );
    }
    for (const meta of this.session.inputMetadata ?? []) {
      if (INPUT_NAMES.includes(meta.name) && meta.isTensor && meta.type !== "int64") {
        throw new ModelError(`${where}: input '${meta.name}' is ${meta.type}, expected int64`);
      }
    }
  }

  /** Logits (a Float32Array over the vocabulary) of the last position, and the cache extended by the new tokens.
   * inputIds and positionIds: the T new tokens and their positions, in [0, blockSize); attentionMask: 1 for each
   * cached and new column (batch 1 has no padding); cache: null (empty) or what the previous call returned. */
  async forward(inputIds, attentionMask, positionIds, cache) {
    const T = inputIds.length;
    const past = cache ? cache.length : 0;
    if (T === 0 || positionIds.length !== T || attentionMask.length !== past + T) {
      throw new Error(`forward: ${T} tokens, ${positionIds.length} positions, a mask of ${attentionMask.length}` +
        ` with ${past} cached`); // the engine's bug, not the user's
    }
    if (positionIds.some((p) => p < 0 || p >= this.blockSize)) {
      throw new Error(`position_ids must lie in [0, block_size) = [0, ${this.blockSize}), got ${positionIds}`);
    }
    const int64 = (values) => new this.ort.Tensor("int64", BigInt64Array.from(values, BigInt), [1, values.length]);
    const feeds = {
      input_ids: int64(inputIds),
      attention_mask: int64(attentionMask),
      position_ids: int64(positionIds),
    };
    const pastValues = cache ? cache.values : this.emptyPast;
    this.pastNames.forEach((name, i) => (feeds[name] = pastValues[i]));
    const outputs = await this.session.run(feeds);
    const V = this.vocabSize;
    const logits = outputs[LOGITS_NAME].data.slice((T - 1) * V, T * V); // (1, T, V) -> the last position's row
    return { logits, cache: { values: this.presentNames.map((name) => outputs[name]), length: past + T } };
  }
}
