import { KvHashError } from "./errors.js";

// Typed arrays use the host's byte order; the hashed form is little-endian.
// On a little-endian host (every platform Node ships for in practice) a
// Uint32Array's bytes already are the hashed form, so they are viewed, not
// rewritten.
const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

function invalidToken(index: number, value: unknown): KvHashError {
  return new KvHashError("INVALID_TOKEN", `token ${index} is ${String(value)}, not an integer in 0..4294967295`);
}

/** Throws KvHashError INVALID_TOKEN at the first token that is not a u32. */
export function checkTokens(tokens: ArrayLike<number>): void {
  if (tokens instanceof Uint32Array) return;
  for (let i = 0; i < tokens.length; i++) {
    const token = tokens[i]!;
    // `>>> 0` maps every u32 to itself and anything else (fractions, negatives,
    // NaN, values past 2^32 - 1, non-numbers) to something different.
    if (token >>> 0 !== token) throw invalidToken(i, token);
  }
}

/**
 * The tokens as the reference hashes them: 4 little-endian bytes each, in one
 * buffer for the whole sequence so that blocks are views into it. A
 * Uint32Array on a little-endian host is viewed without a copy; anything else
 * is validated (KvHashError INVALID_TOKEN) and written once.
 */
export function tokenBytesLe(tokens: ArrayLike<number>): Uint8Array {
  if (tokens instanceof Uint32Array && LITTLE_ENDIAN_HOST) {
    return new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength);
  }
  const n = tokens.length;
  if (LITTLE_ENDIAN_HOST) {
    const words = new Uint32Array(n);
    for (let i = 0; i < n; i++) {
      const token = tokens[i]!;
      if (token >>> 0 !== token) throw invalidToken(i, token);
      words[i] = token;
    }
    return new Uint8Array(words.buffer);
  }
  const bytes = new Uint8Array(n * 4);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < n; i++) {
    const token = tokens[i]!;
    if (token >>> 0 !== token) throw invalidToken(i, token);
    view.setUint32(i * 4, token, true);
  }
  return bytes;
}
