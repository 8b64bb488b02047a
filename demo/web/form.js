// Reading the page's fields into a generation request. Every bad value gets a message naming the field, what it
// holds and what would be accepted (the fields are plain text inputs, so the message can quote what was typed).

import { MAX_NEW_TOKENS_LIMIT, WINDOW_MODES } from "./engine.js";
import { MAX_SEED } from "./rng.js";

export const MAX_TEMPERATURE = 10; // as the server-side demo's Limits

export class FieldError extends Error {
  name = "FieldError";
  constructor(field, message) {
    super(message);
    this.field = field; // the id of the input to mark
  }
}

/** A number typed into a field, or null for an empty field; NaN for text that is not a number. */
function numberIn(text) {
  const trimmed = String(text).trim();
  return trimmed === "" ? null : Number(trimmed);
}

export function parseInteger(field, label, text, lo, hi, hint = "") {
  const value = numberIn(text);
  if (value === null) throw new FieldError(field, `${label} is empty: type a whole number in [${lo}, ${hi}]${hint}`);
  if (!Number.isInteger(value) || value < lo || value > hi) {
    throw new FieldError(field, `${label} must be a whole number in [${lo}, ${hi}]${hint}, got '${text}'`);
  }
  return value;
}

export function parseNumber(field, label, text, lo, hi, { loOpen = false, hint = "" } = {}) {
  const interval = `${loOpen ? "(" : "["}${lo}, ${hi}]`;
  const value = numberIn(text);
  if (value === null) throw new FieldError(field, `${label} is empty: type a number in ${interval}${hint}`);
  if (!Number.isFinite(value) || value < lo || value > hi || (loOpen && value === lo)) {
    throw new FieldError(field, `${label} must be a number in ${interval}${hint}, got '${text}'`);
  }
  return value;
}

/**
 * The request that the fields' texts describe: {prompt, maxNewTokens, sampling: {temperature, topK, topP},
 * seed (null: draw one), windowMode}. Throws a FieldError naming the first bad field.
 * @param {{prompt: string, maxNewTokens: string, temperature: string, topK: string, topP: string, seed: string,
 *          windowMode: string}} fields
 */
export function readForm(fields) {
  if (!fields.prompt) {
    throw new FieldError(
      "prompt",
      "the prompt is empty: type at least one character, e.g. a speaker's name and a colon such as 'ROMEO:' " +
        "(a single newline starts the text from scratch, as the lesson does)",
    );
  }
  const maxNewTokens = parseInteger("max-new-tokens", "Max new tokens", fields.maxNewTokens, 1, MAX_NEW_TOKENS_LIMIT);
  const temperature = parseNumber("temperature", "Temperature", fields.temperature, 0, MAX_TEMPERATURE, {
    hint: " (0 = greedy)",
  });
  const topK = parseInteger("top-k", "Top-k", fields.topK, 0, 1_000_000, " (0 = no limit)");
  const topP = parseNumber("top-p", "Top-p", fields.topP, 0, 1, { loOpen: true, hint: " (1 = off)" });
  const seedText = String(fields.seed).trim();
  const seed = seedText === "" || seedText === "-1"
    ? null
    : parseInteger("seed", "Seed", fields.seed, 0, MAX_SEED, " (empty or -1 = random)");
  if (!WINDOW_MODES.includes(fields.windowMode)) {
    const modes = WINDOW_MODES.join(", ");
    throw new FieldError("window-mode", `the window mode must be one of ${modes}, got '${fields.windowMode}'`);
  }
  return {
    prompt: fields.prompt,
    maxNewTokens,
    sampling: { temperature, topK: topK || null, topP },
    seed,
    windowMode: fields.windowMode,
  };
}
