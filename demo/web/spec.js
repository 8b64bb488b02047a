// The request specification in the browser: gpt_serve/generation/spec.py's `parse_request` over the table it
// writes to spec.json (`spec_json()`), with its messages word for word. The page fetches spec.json
// (`loadSpec`) and passes it here; no limit is written in this file.
//
//   const spec = await loadSpec();
//   const request = parseRequest(spec, { prompt: "ROMEO:", max_new_tokens: 200, temperature: 0.8 });
//   request.maxNewTokens, request.sampling, request.seed          // a null or -1 seed is drawn (seedWasRandom)
//
// Values are what a JSON client would send (numbers, strings, null = the default); an integer may also be a BigInt,
// so that a long integer typed into the form is compared and shown exactly, as Python's int is.

import { randomSeed } from "./rng.js";

export const SPEC_FILE = "spec.json"; // beside this module, wherever the page is served from

/** A refused request, with the message spec.py gives for it; `field` names the bad field (spec.py's name). */
export class RequestError extends Error {
  name = "RequestError";
  constructor(message, field = null) {
    super(message);
    this.field = field;
  }
}

/** The specification table (spec.json, next to this module). */
export async function loadSpec(url = new URL(SPEC_FILE, import.meta.url)) {
  return loadJson(url, "the page's request limits");
}

/** The JSON file at `url`, `what` the page needs it for (named in the error if it cannot be had). */
export async function loadJson(url, what) {
  let response;
  try {
    response = await fetch(url);
  } catch (e) {
    throw new Error(`cannot fetch ${url}, ${what} (${e.message}): is the server up?`);
  }
  if (!response.ok) {
    throw new Error(`${url} answered ${response.status} ${response.statusText}: the page needs it (${what})`);
  }
  try {
    return await response.json();
  } catch (e) {
    throw new Error(`${url} is not valid JSON (${e.message})`);
  }
}

/** 1234567 -> "1,234,567" (Python's `f"{n:,}"`). */
export function commas(n) {
  return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

// Python's str.isprintable() is false for these categories (the space excepted): repr escapes them
const NOT_PRINTABLE = /^[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]$/u;
const ESCAPES = { "\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r" };

/** Python's repr() of a string: 'ROMEO', "it's", '\n', '\x00', '\u200b', 'é'. */
export function pyRepr(text) {
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  const hex = (code, digits) => code.toString(16).padStart(digits, "0");
  const escaped = Array.from(text, (c) => {
    const code = c.codePointAt(0);
    if (c === quote) return `\\${c}`;
    if (c in ESCAPES) return ESCAPES[c];
    if (c !== " " && NOT_PRINTABLE.test(c)) {
      if (code <= 0xff) return `\\x${hex(code, 2)}`;
      return code <= 0xffff ? `\\u${hex(code, 4)}` : `\\U${hex(code, 8)}`;
    }
    return c;
  });
  return quote + escaped.join("") + quote;
}

/** Python's repr() of a float that is not whole: the shortest digits that round-trip (as JavaScript's), written
 * in exponent form below 1e-4 (1e-05, 1.5e-07); 'inf', '-inf', 'nan'. */
function pyFloatRepr(x) {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  const [mantissa, exponent] = x.toExponential().split("e"); // "-1.25e-7": toExponential() gives the shortest digits
  const sign = x < 0 ? "-" : "";
  const digits = mantissa.replace("-", "").replace(".", "");
  const e = Number(exponent);
  if (e < -4 || e >= 16) {
    return `${sign}${mantissa.replace("-", "")}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
  }
  if (e < 0) return `${sign}0.${"0".repeat(-e - 1)}${digits}`;
  return `${sign}${digits.slice(0, e + 1).padEnd(e + 1, "0")}.${digits.slice(e + 1) || "0"}`;
}

/** A number as spec.py writes it in a message: a whole number as an integer (all its digits), else Python's
 * repr. */
function showNumber(x) {
  if (typeof x === "bigint") return x.toString();
  return Number.isInteger(x) ? BigInt(x).toString() : pyFloatRepr(x);
}

/** spec.py's `show_value`: a value for a message, as Python's repr, a whole float as an integer, cut short past
 * 60 characters. */
export function showValue(value) {
  let text;
  if (typeof value === "number" || typeof value === "bigint") text = showNumber(value);
  else if (typeof value === "string") text = pyRepr(value);
  else if (value === null || value === undefined) text = "None";
  else if (typeof value === "boolean") text = value ? "True" : "False";
  else text = JSON.stringify(value);
  const chars = Array.from(text);
  return chars.length <= 60 ? text : `${chars.slice(0, 40).join("")}... (${commas(chars.length)} characters)`;
}

/** The name Python gives the type of a JSON value (for "must be text, got int"). */
function pyTypeName(value) {
  if (typeof value === "number") return Number.isInteger(value) ? "int" : "float";
  if (typeof value === "bigint") return "int";
  if (typeof value === "boolean") return "bool";
  if (value === null || value === undefined) return "NoneType";
  return Array.isArray(value) ? "list" : typeof value === "object" ? "dict" : typeof value;
}

/** spec.py's `Field.interval`: "[0, 2]", "(0, 1]", "[1, inf)". */
function interval(f) {
  const hi = f.hi === undefined || f.hi === null ? "inf)" : `${showNumber(f.hi)}]`;
  return `${f.lo_open ? "(" : "["}${showNumber(f.lo)}, ${hi}`;
}

function checkNumber(name, f, value) {
  const integer = f.kind === "integer";
  const message = `${name} must be ${integer ? "an integer" : "a number"} in ${interval(f)}${f.hint ?? ""}`;
  const refuse = () => new RequestError(`${message}, got ${showValue(value)}`, name);
  if (typeof value !== "number" && typeof value !== "bigint") throw refuse();
  if (typeof value === "number" && (!Number.isFinite(value) || (integer && !Number.isInteger(value)))) throw refuse();
  // a BigInt compares exactly with a number, as Python's int does with a float
  const lowOk = f.lo_open ? value > f.lo : value >= f.lo;
  if (!lowOk || (f.hi !== undefined && f.hi !== null && value > f.hi)) throw refuse();
  return Number(value);
}

/** spec.py's `check_value` for the fields the page has: the value checked (numbers as numbers), or the field's
 * default for null; a RequestError naming the field, the accepted values and what was sent otherwise. */
export function checkValue(spec, name, value) {
  const f = spec[name];
  if (value === null || value === undefined) return f.default;
  if (f.kind === "integer" || f.kind === "number") return checkNumber(name, f, value);
  if (f.kind === "text") {
    if (typeof value !== "string") throw new RequestError(`${name} must be text, got ${pyTypeName(value)}`, name);
    const length = Array.from(value).length; // in characters (code points), as Python's len
    if (length > f.hi) {
      throw new RequestError(
        `${name} is ${commas(length)} characters long; the limit is ${commas(f.hi)} ` +
          "(the model reads only the last block_size characters)",
        name,
      );
    }
    return value;
  }
  if (f.kind === "choice") {
    if (typeof value !== "string" || !f.choices.includes(value)) {
      const choices = `[${f.choices.map(pyRepr).join(", ")}]`;
      throw new RequestError(`${name} must be one of ${choices}, got ${showValue(value)}`, name);
    }
    return value;
  }
  throw new Error(`the page does not take the field ${name} (${f.kind})`); // stop, backend, model: not on the page
}

const PAGE_FIELDS = [
  "prompt", "max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed", "window_mode",
  "refill_tokens", "unk_policy",
];

/**
 * spec.py's `parse_request` for the page's fields ({prompt, max_new_tokens, ...}: spec.py's names; a field left
 * out or null takes its default): {prompt, maxNewTokens, sampling: {temperature, topK, topP, repetitionPenalty},
 * seed, seedWasRandom, windowMode, refillTokens, unkPolicy}. A null or -1 seed is drawn below the table's
 * random_below. Throws a RequestError naming the first bad field, in the table's order (the seed last), as
 * parse_request does.
 */
export function parseRequest(spec, values) {
  const taken = PAGE_FIELDS.filter((name) => name in spec);
  for (const key of Object.keys(values)) {
    if (!taken.includes(key)) {
      const fields = `[${taken.map(pyRepr).join(", ")}]`;
      throw new RequestError(`unknown field ${showValue(key)}; this page's fields are ${fields}`, key);
    }
  }
  const checked = {};
  for (const name of Object.keys(spec).filter((n) => taken.includes(n) && n !== "seed")) {
    checked[name] = checkValue(spec, name, values[name]);
  }
  const seed = values.seed ?? null;
  const seedWasRandom = seed === null || seed === -1 || seed === -1n;
  checked.seed = seedWasRandom ? randomSeed(spec.seed.random_below) : checkValue(spec, "seed", seed);
  if (checked.window_mode === "exact" && checked.refill_tokens !== null) {
    throw new RequestError("refill_tokens applies only with window_mode 'refill'", "refill_tokens");
  }
  return {
    prompt: checked.prompt,
    maxNewTokens: checked.max_new_tokens,
    sampling: {
      temperature: checked.temperature,
      topK: checked.top_k || null, // 0: no limit
      topP: checked.top_p,
      repetitionPenalty: checked.repetition_penalty,
    },
    seed: checked.seed,
    seedWasRandom,
    windowMode: checked.window_mode,
    refillTokens: checked.refill_tokens,
    unkPolicy: checked.unk_policy,
  };
}
