/**
 * A pool's Cuckoo filter as the page mirrors it: occupied slots per bucket,
 * kept from sparse snapshot chunks and deltas, and drawn as a heat map in
 * which each cell covers an equal run of buckets.
 */

/** Cells of the heat map at most (256 × 64): a 2^24-bucket filter is 1,024 buckets a cell. */
const MAX_CELLS = 256 * 64;
export const HEAT_COLUMNS = 256;

/** Occupied 16-bit slots of a bucket word (four slots, slot 0 in the low bits). */
export function slotsOf(word: bigint): number {
  if (word === 0n) return 0;
  let n = 0;
  for (let shift = 0n; shift < 64n; shift += 16n) if (((word >> shift) & 0xffffn) !== 0n) n += 1;
  return n;
}

export class Lane {
  private readonly slots: Uint8Array;
  /** Occupied slots per heat-map cell. */
  readonly cells: Uint32Array;
  readonly bucketsPerCell: number;
  occupiedSlots = 0;
  nonEmptyBuckets = 0;

  constructor(readonly bucketCount: number) {
    this.slots = new Uint8Array(bucketCount);
    const cells = Math.min(bucketCount, MAX_CELLS);
    this.bucketsPerCell = Math.max(1, Math.ceil(bucketCount / cells));
    this.cells = new Uint32Array(Math.ceil(bucketCount / this.bucketsPerCell));
  }

  reset(): void {
    this.slots.fill(0);
    this.cells.fill(0);
    this.occupiedSlots = 0;
    this.nonEmptyBuckets = 0;
  }

  /** A bucket's new word (0: it became empty). */
  set(bucket: number, word: bigint): void {
    if (bucket < 0 || bucket >= this.bucketCount) return;
    const next = slotsOf(word);
    const prev = this.slots[bucket]!;
    if (next === prev) return;
    this.slots[bucket] = next;
    const cell = Math.floor(bucket / this.bucketsPerCell);
    this.cells[cell] = this.cells[cell]! + next - prev;
    this.occupiedSlots += next - prev;
    if (prev === 0) this.nonEmptyBuckets += 1;
    else if (next === 0) this.nonEmptyBuckets -= 1;
  }
}

/**
 * Draws the lane: empty cells dark, occupied ones from blue to yellow by the
 * share of their slots in use (square root, so that one entry in a cell of
 * thousands of slots still shows).
 */
export function drawHeatmap(canvas: HTMLCanvasElement, lane: Lane): void {
  const columns = Math.min(HEAT_COLUMNS, lane.cells.length);
  const rows = Math.ceil(lane.cells.length / columns);
  if (canvas.width !== columns || canvas.height !== rows) {
    canvas.width = columns;
    canvas.height = rows;
  }
  const g = canvas.getContext("2d");
  if (g === null) return;
  const image = g.createImageData(columns, rows);
  const d = image.data;
  const capacity = lane.bucketsPerCell * 4;
  for (let i = 0; i < lane.cells.length; i += 1) {
    const o = i * 4;
    const used = lane.cells[i]!;
    if (used === 0) {
      d[o] = 24;
      d[o + 1] = 30;
      d[o + 2] = 44;
    } else {
      const t = 0.3 + 0.7 * Math.sqrt(Math.min(1, used / capacity));
      d[o] = Math.round(40 + 215 * t);
      d[o + 1] = Math.round(90 + 150 * t);
      d[o + 2] = Math.round(220 * (1 - t) + 30);
    }
    d[o + 3] = 255;
  }
  g.putImageData(image, 0, 0);
}
