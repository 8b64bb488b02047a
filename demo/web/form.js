// Reading the page's fields into a generation request: the texts typed into the form, turned into the values a JSON
// client would send and parsed by the request specification (spec.js, spec.json), so that a bad field gets
// exactly the message gpt_serve gives for it. No DOM here: app.js reads the inputs, and Node can import this file.

import { encodePrompt } from "./engine.js";
import { RequestError, parseRequest } from "./spec.js";

// The page's fields, by their names in the specification; each one's input has the id inputId(name).
export const FORM_FIELDS = ["prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "window_mode",
  "unk_policy"];
const NUMBER_FIELDS = new Set(["max_new_tokens", "temperature", "top_k", "top_p", "seed"]);
const INTEGER_TEXT = /^[+-]?[0-9]+$/;
const DECIMAL_TEXT = /^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$/;

/** "max_new_tokens" -> "max-new-tokens", the id of the field's input. */
export const inputId = (name) => name.replaceAll("_", "-");

export class FieldError extends Error {
  name = "FieldError";
  constructor(field, message) {
    super(message);
    this.field = field; // the id of the input to mark
  }
}

/**
 * What a number field's text sends: an integer as a BigInt (compared and shown exactly, as Python's int), a
 * decimal number (1.5, -2e-7, .5) as a number, an empty seed as null (random); any other text as it is typed, so
 * that the message quotes it ("got '12x'").
 */
export function typedValue(name, text) {
  const trimmed = String(text).trim();
  if (!NUMBER_FIELDS.has(name)) return text;
  if (name === "seed" && trimmed === "") return null;
  if (INTEGER_TEXT.test(trimmed)) return BigInt(trimmed);
  if (DECIMAL_TEXT.test(trimmed)) return Number(trimmed);
  return text;
}

/**
 * The request that the fields' texts describe (spec.js's parseRequest: {prompt, maxNewTokens, sampling, seed,
 * seedWasRandom, windowMode, refillTokens, unkPolicy}) with promptIds, the prompt encoded by `vocab`. Throws a
 * FieldError naming the first bad field's input, with the specification's message.
 * @param {Object<string, string>} fields the texts of FORM_FIELDS, by name (one left out takes its default)
 * @param {object} spec the specification table (spec.json)
 * @param {import("./vocab.js").CharVocab} vocab the model's vocabulary
 * @param {string} [unkHint] how the page accepts characters outside the vocabulary (form.json's unk_policy.hint)
 */
export function readForm(fields, spec, vocab, unkHint = undefined) {
  try {
    const given = FORM_FIELDS.filter((name) => fields[name] !== undefined && fields[name] !== null);
    const values = Object.fromEntries(given.map((name) => [name, typedValue(name, fields[name])]));
    const request = parseRequest(spec, values);
    return { ...request, promptIds: encodePrompt(vocab, request.prompt, request.unkPolicy, unkHint) };
  } catch (e) {
    if (!(e instanceof RequestError)) throw e;
    throw new FieldError(inputId(e.field ?? "prompt"), e.message);
  }
}
