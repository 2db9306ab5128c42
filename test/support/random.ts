/** A deterministic xorshift PRNG in [0, 1), so that a failing "random" schedule can be replayed from its seed. */
export function prng(seed: number): () => number {
  let x = seed | 0 || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) / 2 ** 32;
  };
}
