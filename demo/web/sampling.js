// Choosing the next token from logits: gpt_serve/generation/sampling.py for one row, in float64 like numpy.
// The order of operations is the Python sampler's: repetition penalty (engine) -> temperature -> top-k -> softmax
// -> top-p -> one uniform draw through the inverse CDF. Temperature 0 is argmax (greedy) and draws nothing, and so
// is any temperature below GREEDY_BELOW (the Python sampler's: logits / 5e-324 would overflow to a NaN softmax).
export const GREEDY_BELOW = 1e-5;

/** Checked sampling settings (SamplingParams): temperature >= 0 (0 = greedy), topK integer >= 0 or null (0 and
 * null: no limit), topP in (0, 1], repetitionPenalty > 0 (1 = off). Throws an Error naming a bad value. */
export function samplingParams({ temperature = 1.0, topK = null, topP = 1.0, repetitionPenalty = 1.0 } = {}) {
  if (typeof temperature !== "number" || !Number.isFinite(temperature) || temperature < 0) {
    throw new Error(`temperature must be a finite number >= 0 (0 = greedy), got ${temperature}`);
  }
  if (topK !== null && !(Number.isSafeInteger(topK) && topK >= 0)) {
    throw new Error(`top_k must be null or an integer >= 0 (0 = no limit), got ${topK}`);
  }
  if (typeof topP !== "number" || !(topP > 0 && topP <= 1)) throw new Error(`top_p must be in (0, 1], got ${topP}`);
  const r = repetitionPenalty;
  if (typeof r !== "number" || !Number.isFinite(r) || r <= 0) {
    throw new Error(`repetition_penalty must be a finite number > 0 (1 = off), got ${r}`);
  }
  return Object.freeze({ temperature, topK, topP, repetitionPenalty });
}

/** transformers' rule: a seen token's logit is divided by `penalty` if positive, multiplied if negative. */
export function applyRepetitionPenalty(logits, context, penalty) {
  if (penalty === 1.0) return logits;
  const out = Float32Array.from(logits); // float32, as the Python side keeps the backend's dtype
  for (const id of new Set(context)) out[id] = out[id] > 0 ? out[id] / penalty : out[id] * penalty;
  return out;
}

/** The next token id: argmax below GREEDY_BELOW (the first of equal maxima, as numpy's), else a draw. */
export function sampleNext(logits, params, rng) {
  if (params.temperature < GREEDY_BELOW) return argmax(logits);
  return draw(probabilities(logits, params), rng.random());
}

export function argmax(values) {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

/** The filtered softmax (a Float64Array over the vocabulary) that a temperature > 0 draw samples from. */
export function probabilities(logits, params) {
  const V = logits.length;
  let z = Float64Array.from(logits, (x) => x / params.temperature);
  if (params.topK && params.topK < V) {
    const kth = Float64Array.from(z).sort()[V - params.topK]; // the k-th largest value; ties with it stay
    z = z.map((x) => (x < kth ? -Infinity : x));
  }
  const max = z.reduce((m, x) => Math.max(m, x), -Infinity);
  let probs = z.map((x) => Math.exp(x - max));
  probs = normalized(probs);
  if (params.topP < 1.0) {
    const order = Array.from(probs.keys()).sort((a, b) => probs[b] - probs[a] || a - b); // stable, descending
    // keep a token if the probability before it is still short of top_p (the first token always stays);
    // `cumsum - p`, as the Python sampler computes it
    let cumsum = 0;
    const kept = new Float64Array(V);
    for (const id of order) {
      cumsum += probs[id];
      if (cumsum - probs[id] < params.topP) kept[id] = probs[id];
    }
    probs = normalized(kept);
  }
  return probs;
}

/** The token that a uniform number `u` in [0, 1) picks from `probs` (inverse CDF). */
export function draw(probs, u) {
  let cdf = 0;
  const total = probs.reduce((s, p) => s + p, 0);
  let count = 0; // how many cumulative sums are <= u * total: the picked id
  for (const p of probs) {
    cdf += p;
    if (cdf <= u * total) count++;
  }
  return Math.min(count, probs.length - 1);
}

function normalized(values) {
  const total = values.reduce((s, x) => s + x, 0);
  return values.map((x) => x / total);
}
