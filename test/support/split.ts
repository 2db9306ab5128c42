/** Every way to cut a byte sequence into consecutive parts, for parsers fed in chunks. */

/** Inputs longer than this are not split into three parts (the count grows with the square of the length). */
export const MAX_THREE_PART_LENGTH = 512;

export interface SplitOptions {
  /** 2 (the default) or 3 parts; 3 only for inputs of up to MAX_THREE_PART_LENGTH bytes. */
  readonly parts?: 2 | 3;
}

/**
 * Yields every split of `bytes` into `parts` consecutive parts, empty parts
 * included (a cut at the start or the end): length + 1 splits for two parts,
 * (length + 1)(length + 2) / 2 for three. The parts are views of `bytes`.
 */
export function* splitAtEveryBoundary(bytes: Uint8Array, options: SplitOptions = {}): Generator<Uint8Array[]> {
  const parts = options.parts ?? 2;
  if (parts === 2) {
    for (let a = 0; a <= bytes.length; a++) yield [bytes.subarray(0, a), bytes.subarray(a)];
    return;
  }
  if (bytes.length > MAX_THREE_PART_LENGTH) {
    throw new RangeError(`splitting ${bytes.length} bytes into three parts: at most ${MAX_THREE_PART_LENGTH}`);
  }
  for (let a = 0; a <= bytes.length; a++) {
    for (let b = a; b <= bytes.length; b++) yield [bytes.subarray(0, a), bytes.subarray(a, b), bytes.subarray(b)];
  }
}
