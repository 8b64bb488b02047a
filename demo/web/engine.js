// The generation engine in the browser: gpt_serve/generation/inline.py for one prompt (batch 1), same names.
//
// The engine knows nothing about what computes the logits: a model is anything with blockSize, vocabSize and
//   forward(inputIds, attentionMask, positionIds, cache) -> Promise<{logits, cache}>   (see model.js)
//
// Past block_size the engine slides the window: when the text no longer fits, it restarts the cache from the last
// `keep` tokens at positions 0..keep-1, with keep = block_size for windowMode "exact" (so every step past the
// window is a full-window forward: the lesson's idx[:, -block_size:], exactly) and keep = refillTokens (default
// block_size // 2) for "refill" (the cache then grows again for block_size - refillTokens cheap steps).
// Greedy decoding (temperature 0) gives the Python engine's tokens on the same ONNX file (checked under Node by
// tests/demo/test_web_engine.py); sampling draws from this page's own seeded RNG (rng.js), so a seed repeats a run
// here but does not give numpy's tokens. What a request may ask for (its limits, defaults and messages) is the request
// specification's (spec.js); this file checks only what it needs to run.

import { Rng, randomSeed } from "./rng.js";
import { applyRepetitionPenalty, sampleNext, samplingParams } from "./sampling.js";
import { RequestError, commas, pyRepr, showValue } from "./spec.js";

export const WINDOW_MODES = ["exact", "refill"]; // gpt_serve/chargpt/window.py's, the choices of the spec's window_mode

/** How many tokens survive when the window overflows (gpt_serve/chargpt/window.py's window_keep). */
export function windowKeep(blockSize, windowMode, refillTokens = null) {
  if (!WINDOW_MODES.includes(windowMode)) {
    const modes = `[${WINDOW_MODES.map(pyRepr).join(", ")}]`;
    throw new Error(`window_mode must be one of ${modes}, got ${showValue(windowMode)}`);
  }
  if (windowMode === "exact") {
    if (refillTokens !== null) {
      throw new Error(`refill_tokens applies only with window_mode 'refill', got ${showValue(refillTokens)}`);
    }
    return blockSize;
  }
  const keep = refillTokens ?? Math.max(1, Math.floor(blockSize / 2));
  if (!Number.isSafeInteger(keep) || keep < 1 || keep >= Math.max(2, blockSize)) {
    const hi = Math.max(1, blockSize - 1);
    throw new Error(`refill_tokens must be an integer in [1, block_size - 1] = [1, ${hi}], got ${showValue(keep)}`);
  }
  return keep;
}

/** An Error unless `ids` is a non-empty array of ids in [0, vocabSize). */
export function checkPromptIds(ids, vocabSize, name = "the prompt") {
  if (!ids.length) {
    throw new Error(`${name} is empty; give at least one token (the lesson starts from id 0, a newline)`);
  }
  const bad = ids.filter((t) => !(Number.isInteger(t) && t >= 0 && t < vocabSize));
  if (bad.length) {
    throw new Error(`${name} holds ids [${bad.slice(0, 10)}] outside the vocabulary [0, ${vocabSize - 1}]`);
  }
}

// How a request accepts characters outside the vocabulary, in the API's words (text.py's UNK_HINT); the page's form
// passes its control's words instead (form.json's unk_policy.hint).
export const UNK_HINT = "set unk_policy to 'replace' (each becomes a space) or 'drop'";

/** The prompt's ids (gpt_serve/generation/text.py's encode_prompt, with its messages). The empty prompt starts
 * after a newline (id 0), as the lesson's generate(torch.zeros((1, 1))) does. With unkPolicy "error", a
 * RequestError names the characters outside the vocabulary (the first ten and a count) and how to accept them
 * (unkHint); "replace" makes each a space, "drop" removes them (a RequestError if nothing is left). */
export function encodePrompt(vocab, prompt, unkPolicy = "error", unkHint = UNK_HINT) {
  if (!prompt) return [0];
  if (unkPolicy === "error") {
    const unknown = vocab.unknown(prompt);
    if (unknown.length) {
      const count = unknown.length;
      const shown = unknown.slice(0, 10).map(([i, c]) => `${pyRepr(c)} (position ${i})`).join(", ");
      const more = count > 10 ? ` and ${count - 10} more` : "";
      throw new RequestError(
        `the prompt has ${commas(count)} character${count > 1 ? "s" : ""} outside this model's vocabulary: ` +
          `${shown}${more}. Remove them, or ${unkHint}`,
        "prompt",
      );
    }
  }
  const ids = vocab.encode(prompt, unkPolicy);
  if (!ids.length) {
    throw new RequestError("the prompt has no character left once the unknown ones are dropped", "prompt");
  }
  return ids;
}

/**
 * Yields the next token id, maxNewTokens times at most; ends early after a token of stopTokenIds (yielded).
 * Breaking out of the loop (the generator's return()) stops the computation after the current forward.
 *
 * @param {{blockSize: number, vocabSize: number, forward: Function}} model
 * @param {number[]} promptIds
 * @param {number} maxNewTokens
 * @param {{sampling?: object, seed?: number|null, windowMode: string, refillTokens?: number|null,
 *          stopTokenIds?: number[]}} options sampling: samplingParams(...) or its fields (default: temperature 1);
 *          seed null: 32 random bits; windowMode: "exact" or "refill" (a parsed request's, spec.js)
 */
export async function* generateTokens(model, promptIds, maxNewTokens, options = {}) {
  const { seed = null, windowMode, refillTokens = null, stopTokenIds = [] } = options;
  const sampling = samplingParams(options.sampling ?? {});
  if (!Number.isSafeInteger(maxNewTokens) || maxNewTokens < 0) {
    throw new Error(`max_new_tokens must be an integer >= 0, got ${maxNewTokens}`);
  }
  const keep = windowKeep(model.blockSize, windowMode, refillTokens);
  checkPromptIds(promptIds, model.vocabSize);
  const rng = new Rng(seed ?? randomSeed(2 ** 32)); // the Rng checks the seed
  const ids = [...promptIds];
  const stops = new Set(stopTokenIds);
  let [cache, start, cached] = [null, 0, 0]; // the cache holds the tokens ids[start .. start + cached)
  for (let step = 0; step < maxNewTokens; step++) {
    const total = ids.length; // tokens so far
    if (total - start > model.blockSize) {
      // the window overflows: restart it from the last `keep` tokens, at positions 0..keep-1
      [start, cache, cached] = [total - keep, null, 0];
    }
    const lo = start + cached; // the first token not in the cache
    const windowMask = new Array(total - start).fill(1); // batch 1: no padding, every column is a real token
    const positions = Array.from({ length: total - lo }, (_, i) => lo - start + i);
    const out = await model.forward(ids.slice(lo, total), windowMask, positions, cache);
    [cache, cached] = [out.cache, total - start];
    const logits = applyRepetitionPenalty(out.logits, ids, sampling.repetitionPenalty);
    const token = sampleNext(logits, sampling, rng);
    ids.push(token);
    yield token;
    if (stops.has(token)) return;
  }
}
