// A small seeded random number generator for the page's sampler: xoshiro128** seeded through splitmix32.
// It plays the part of numpy's `default_rng(seed)` in the Python engine, with its own stream: the same seed gives
// the same tokens from run to run in the browser, but not the tokens numpy would pick. The seeds a request may
// give, and the range a random one is drawn from, are the request specification's (spec.json, spec.js).

function splitmix32(state) {
  return () => {
    state = (state + 0x9e3779b9) | 0;
    let z = state ^ (state >>> 16);
    z = Math.imul(z, 0x21f0aaad);
    z ^= z >>> 15;
    z = Math.imul(z, 0x735a2d97);
    return (z ^ (z >>> 15)) >>> 0;
  };
}

const rotl = (x, k) => (x << k) | (x >>> (32 - k));

export class Rng {
  /** @param {number} seed an integer in [0, 2^53 - 1], every integer a JavaScript number holds exactly */
  constructor(seed) {
    if (!Number.isSafeInteger(seed) || seed < 0) {
      throw new Error(`seed must be an integer in [0, ${Number.MAX_SAFE_INTEGER}], got ${seed}`);
    }
    // the low and the high 32 bits of the seed each fill half the state, so different seeds never share a state
    const low = splitmix32(seed >>> 0);
    const high = splitmix32(Math.floor(seed / 2 ** 32) ^ 0x6a09e667);
    this.s = new Uint32Array([low(), low(), high(), high()]);
    if (this.s.every((x) => x === 0)) this.s[0] = 1; // the one state xoshiro cannot leave
  }

  /** The next 32 random bits, as an unsigned integer. */
  nextUint32() {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1], 5), 7), 9) >>> 0;
    const t = s[1] << 9;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return result;
  }

  /** A uniform number in [0, 1) with 53 random bits, like numpy's `Generator.random()`. */
  random() {
    const high = this.nextUint32() >>> 5; // 27 bits
    const low = this.nextUint32() >>> 6; // 26 bits
    return (high * 2 ** 26 + low) / 2 ** 53;
  }
}

/** A uniform random seed in [0, below), below <= 2^32 (the specification's random_below): for a request without
 * a seed, shown to the user so that the run can be repeated. */
export function randomSeed(below) {
  if (!(Number.isSafeInteger(below) && below >= 1 && below <= 2 ** 32)) {
    throw new Error(`randomSeed draws below an integer in [1, 2^32], got ${below}`);
  }
  const draws = new Uint32Array(1);
  const usable = 2 ** 32 - (2 ** 32 % below); // draws from [usable, 2^32) would favour the low seeds: drawn again
  do {
    crypto.getRandomValues(draws);
  } while (draws[0] >= usable);
  return draws[0] % below;
}
