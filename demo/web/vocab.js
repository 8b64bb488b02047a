// The character vocabulary of a model folder's vocab.json ({character: id}), as gpt_serve/chargpt/vocab.py reads it:
// id = rank, one character per token. Characters outside it are refused, dropped or replaced by a space (the
// unk_policy "error", "drop", "replace"); the page's message for them is encodePrompt's (engine.js).

import { pyRepr } from "./spec.js";

export const UNK_POLICIES = ["error", "drop", "replace"]; // gpt_serve/chargpt/vocab.py's, the choices of the spec's unk_policy

/** "1 character", "2 characters" */
export function plural(n, noun) {
  return `${n} ${noun}${n === 1 ? "" : "s"}`;
}

export class CharVocab {
  /** @param {string[]} chars the vocabulary in id order, each one distinct character */
  constructor(chars) {
    if (!chars.length) throw new Error("a character vocabulary needs at least one character, got none");
    // Array.from splits by code point, so a character outside the BMP counts as one (as in Python)
    const bad = chars.filter((c) => typeof c !== "string" || Array.from(c).length !== 1);
    if (bad.length) {
      throw new Error(`every vocabulary entry must be a single character, got ${JSON.stringify(bad.slice(0, 5))}`);
    }
    this.chars = chars;
    this.stoi = new Map(chars.map((c, i) => [c, i]));
    if (this.stoi.size !== chars.length) throw new Error("the vocabulary has duplicate characters");
  }

  /** A vocab.json's parsed content; `where` names the file in messages. */
  static fromJSON(mapping, where = "vocab.json") {
    const ids = mapping && typeof mapping === "object" && !Array.isArray(mapping) ? Object.values(mapping) : null;
    const sorted = ids && [...ids].sort((a, b) => a - b);
    if (!sorted || !sorted.every((id, i) => id === i)) {
      throw new Error(`${where} must map each character to a distinct id 0..n-1`);
    }
    return new CharVocab(Object.keys(mapping).sort((a, b) => mapping[a] - mapping[b]));
  }

  get size() {
    return this.chars.length;
  }

  /** [position, character] of every character of `text` outside the vocabulary (positions in code points). */
  unknown(text) {
    return Array.from(text).flatMap((c, i) => (this.stoi.has(c) ? [] : [[i, c]]));
  }

  /** The ids of `text`; unknown characters per `unkPolicy` (CharVocab.encode): "error" throws an Error naming
   * them, "drop" removes them, "replace" makes each the replacement character (a space, or the first character of
   * a vocabulary without one). */
  encode(text, unkPolicy = "error") {
    if (!UNK_POLICIES.includes(unkPolicy)) {
      throw new Error(`unk_policy must be one of [${UNK_POLICIES.map(pyRepr).join(", ")}], got ${unkPolicy}`);
    }
    const unknown = this.unknown(text);
    if (unknown.length && unkPolicy === "error") {
      const shown = unknown.slice(0, 10).map(([i, c]) => `${pyRepr(c)} at ${i}`).join(", ");
      const more = unknown.length > 10 ? ` and ${unknown.length - 10} more` : "";
      throw new Error(
        `text has ${plural(unknown.length, "character")} outside the vocabulary: ${shown}${more}. ` +
          "Use unk_policy='drop' or 'replace' to accept them.",
      );
    }
    const replacement = unkPolicy === "drop" ? [] : [this.stoi.get(this.stoi.has(" ") ? " " : this.chars[0])];
    return Array.from(text, (c) => (this.stoi.has(c) ? [this.stoi.get(c)] : replacement)).flat();
  }

  decode(ids) {
    const out = ids.map((id) => this.chars[id]);
    const bad = ids.filter((id, i) => out[i] === undefined);
    if (bad.length) throw new Error(`token ids ${bad.slice(0, 10)} are outside the vocabulary [0, ${this.size - 1}]`);
    return out.join("");
  }

  /** sha256 (hex) of the id -> character mapping, as CharVocab.sha256 computes it; null where the page is not
   * a secure context (crypto.subtle exists only on https:// and localhost). */
  async sha256() {
    if (!globalThis.crypto?.subtle) return null;
    const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(this.chars.join("")));
    return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
  }
}
