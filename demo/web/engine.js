// The generation engine in the browser: gpt_serve/generation/engine.py for one prompt (batch 1), same names.
//
// The engine knows nothing about what computes the logits: a model is anything with blockSize, vocabSize and
//   forward(inputIds, attentionMask, positionIds, cache) -> Promise<{logits, cache}>   (see model.js)
//
// Past block_size the engine slides the window: when the text no longer fits, it restarts the cache from the last
// `keep` tokens at positions 0..keep-1, with keep = block_size for windowMode "exact" (so every step past the
// window is a full-window forward: the lesson's idx[:, -block_size:], exactly) and keep = refillTokens (default
// block_size // 2) for "refill" (the cache then grows again for block_size - refillTokens cheap steps).
// Greedy decoding (temperature 0) gives the Python engine's tokens on the same ONNX file; sampling draws from this
// page's own seeded RNG (rng.js), so a seed repeats a run here but does not give numpy's tokens.

import { MAX_SEED, Rng, randomSeed } from "./rng.js";
import { applyRepetitionPenalty, sampleNext, samplingParams } from "./sampling.js";

export const WINDOW_MODES = ["exact", "refill"];
export const MAX_NEW_TOKENS_LIMIT = 1_000_000;

/** How many tokens survive when the window overflows. */
export function windowKeep(blockSize, windowMode, refillTokens = null) {
  if (!WINDOW_MODES.includes(windowMode)) {
    throw new Error(`window_mode must be one of ${WINDOW_MODES.join(", ")}, got '${windowMode}'`);
  }
  if (windowMode === "exact") return blockSize;
  const keep = refillTokens ?? Math.max(1, Math.floor(blockSize / 2));
  if (!Number.isSafeInteger(keep) || keep < 1 || keep >= Math.max(2, blockSize)) {
    throw new Error(`refill_tokens must be an integer in [1, block_size - 1] = [1, ${blockSize - 1}], got ${keep}`);
  }
  return keep;
}

export function checkSeed(seed) {
  if (seed !== null && !(Number.isSafeInteger(seed) && seed >= 0 && seed <= MAX_SEED)) {
    throw new Error(`seed must be null or an integer in [0, ${MAX_SEED}], got ${seed}`);
  }
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

/** Prompt text -> ids; the empty prompt means "start from id 0" (a newline in Tiny Shakespeare), as in the lesson's
 * generate(torch.zeros((1, 1))). Unknown characters throw an UnknownCharactersError naming them. */
export function encodePrompt(vocab, prompt) {
  const ids = vocab.encode(prompt);
  return ids.length ? ids : [0];
}

/**
 * Yields the next token id, maxNewTokens times at most; ends early after a token of stopTokenIds (yielded).
 * Breaking out of the loop (the generator's return()) stops the computation after the current forward.
 *
 * @param {{blockSize: number, vocabSize: number, forward: Function}} model
 * @param {number[]} promptIds
 * @param {number} maxNewTokens
 * @param {{sampling?: object, seed?: number|null, windowMode?: string, refillTokens?: number|null,
 *          stopTokenIds?: number[]}} options sampling: samplingParams(...) or its fields (default: temperature 1)
 */
export async function* generateTokens(model, promptIds, maxNewTokens, options = {}) {
  const { seed = null, windowMode = "exact", refillTokens = null, stopTokenIds = [] } = options;
  const sampling = samplingParams(options.sampling ?? {});
  if (!Number.isSafeInteger(maxNewTokens)) throw new Error(`max_new_tokens must be an integer, got ${maxNewTokens}`);
  if (maxNewTokens < 0 || maxNewTokens > MAX_NEW_TOKENS_LIMIT) {
    throw new Error(`max_new_tokens must be in [0, ${MAX_NEW_TOKENS_LIMIT}], got ${maxNewTokens}`);
  }
  checkSeed(seed);
  const keep = windowKeep(model.blockSize, windowMode, refillTokens);
  checkPromptIds(promptIds, model.vocabSize);
  const rng = new Rng(seed ?? randomSeed());
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
