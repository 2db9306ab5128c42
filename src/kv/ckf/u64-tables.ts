/**
 * Hash tables keyed by u64 hashes given as (hi, lo) u32 halves, in typed
 * arrays: the producer state's ownership and lineage maps.
 *
 * A JavaScript Map keyed by bigint hashes every key through the BigInt's
 * digits on each lookup, and each entry costs a BigInt and often an object
 * of its own: about half of applying a block went there, plus the garbage
 * collection of what it allocated. Here a lookup is a few integer
 * operations over typed arrays, and neither a lookup nor an insert allocates
 * (growing aside). Linear probing, at most half full, with backward-shift
 * deletion (no tombstones).
 */

/** A 32-bit hash of a u64 (murmur3's finalizer over lo ^ hi * golden ratio); the halves as u32s or int32s. */
export function mixU64(hi: number, lo: number): number {
  let h = (lo ^ Math.imul(hi, 0x9e37_79b1)) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85eb_ca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2_ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/** Shards of the ownership table: a power of two, picked by the top bits of the key's hash. */
const OWNER_SHARDS = 256;
const OWNER_SHARD_SHIFT = 24;
const MIN_SHARD_CAPACITY = 16;
/**
 * Shard arrays of up to SLAB_SHARD_BYTES are views into shared slabs of
 * SLAB_BYTES: an ArrayBuffer costs microseconds to make whatever its size, a
 * view a tenth of that, and the shards of a growing table all resize at about
 * the same sizes. A slab lives while any view into it does, so only small
 * arrays share one: the memory a slab can hold on to is bounded by a few
 * times the small tables' own size.
 */
const SLAB_BYTES = 64 * 1024;
const SLAB_SHARD_BYTES = 8 * 1024;

/** Slot states of an ownership shard. */
const EMPTY = 0;
const HELD = 1;
const RESIDENT = 2;

/**
 * One shard of OwnerTable: an open-addressing table of its own, so that a
 * resize moves 1/256 of the entries. A slot is four u32s (key hi, key lo,
 * owners, state), one cache line's quarter: a probe reads one line.
 */
class OwnerShard {
  slots: Uint32Array;
  mask: number;
  size = 0;

  /** `slots`: four zeroed u32s per slot, a power of two of slots. */
  constructor(slots: Uint32Array) {
    this.slots = slots;
    this.mask = slots.length / 4 - 1;
  }

  /** Moves every entry into `slots` (zeroed, as for the constructor). */
  resize(slots: Uint32Array): void {
    const old = this.slots;
    const mask = slots.length / 4 - 1;
    for (let p = 0; p < old.length; p += 4) {
      if (old[p + 3] === EMPTY) continue;
      const hi = old[p]!;
      const lo = old[p + 1]!;
      let at = mixU64(hi, lo) & mask;
      while (slots[at * 4 + 3] !== EMPTY) at = (at + 1) & mask;
      const q = at * 4;
      slots[q] = hi;
      slots[q + 1] = lo;
      slots[q + 2] = old[p + 2]!;
      slots[q + 3] = old[p + 3]!;
    }
    this.slots = slots;
    this.mask = mask;
  }
}

/**
 * Canonical hash -> (owners, resident), sharded OWNER_SHARDS ways so that a
 * resize is small: a table that doubles in one call at millions of entries
 * holds the event loop for tens of milliseconds, whatever slices the work
 * around it. A cursor API: `find` or `insert` positions it at an entry, the
 * accessors read and write that entry, and any insert or remove moves it.
 */
export class OwnerTable {
  private readonly shards: OwnerShard[] = [];
  private count = 0;
  /** The cursor: the shard and slot offset (slot * 4) of the last entry found or inserted. */
  private shard: OwnerShard;
  private at = 0;
  /** Where the last `find` that missed stopped: an insert of that key goes there unless the shard must grow. */
  private missShard: OwnerShard | undefined;
  private missAt = 0;

  /** The slab small shard arrays are cut from, and the bytes of it already cut. */
  private slab: ArrayBuffer | undefined;
  private slabUsed = 0;

  constructor() {
    for (let i = 0; i < OWNER_SHARDS; i++) this.shards.push(new OwnerShard(this.allocate(MIN_SHARD_CAPACITY)));
    this.shard = this.shards[0]!;
  }

  /** Zeroed slots for a shard of `capacity` slots. */
  private allocate(capacity: number): Uint32Array {
    const bytes = capacity * 16;
    if (bytes > SLAB_SHARD_BYTES) return new Uint32Array(capacity * 4);
    if (this.slab === undefined || this.slabUsed + bytes > SLAB_BYTES) {
      this.slab = new ArrayBuffer(SLAB_BYTES);
      this.slabUsed = 0;
    }
    const slots = new Uint32Array(this.slab, this.slabUsed, capacity * 4);
    this.slabUsed += bytes;
    return slots;
  }

  get size(): number {
    return this.count;
  }

  /**
   * The state word of the slot where a probe for a key of hash `hash`
   * (mixU64 of the key) starts, read for its memory only: reading the slots
   * of a batch of keys before finding them has their cache misses overlap.
   */
  peek(hash: number): number {
    const shard = this.shards[hash >>> OWNER_SHARD_SHIFT]!;
    return shard.slots[(hash & shard.mask) * 4 + 3]!;
  }

  /**
   * Positions the cursor at the entry of (hi, lo); false when there is none.
   * `hash` is `mixU64(hi, lo)`. The halves may come as u32s or as int32s of
   * the same bits (see asInt32).
   */
  find(hiBits: number, loBits: number, hash = mixU64(hiBits, loBits)): boolean {
    const hi = hiBits >>> 0;
    const lo = loBits >>> 0;
    const h = hash;
    const shard = this.shards[h >>> OWNER_SHARD_SHIFT]!;
    const { slots, mask } = shard;
    let at = h & mask;
    for (;;) {
      const p = at * 4;
      if (slots[p + 3] === EMPTY) {
        this.missShard = shard;
        this.missAt = p;
        return false;
      }
      if (slots[p + 1] === lo && slots[p] === hi) {
        this.shard = shard;
        this.at = p;
        this.missShard = undefined;
        return true;
      }
      at = (at + 1) & mask;
    }
  }

  /**
   * Adds (hi, lo) with no owners, not resident, right after a `find` of the
   * same key missed (nothing changed the table in between); the cursor moves
   * to it.
   */
  insert(hi: number, lo: number, hash = mixU64(hi, lo)): void {
    let shard = this.missShard;
    let p = this.missAt;
    this.missShard = undefined;
    if (shard === undefined || (shard.size + 1) * 2 > shard.mask + 1) {
      const h = hash;
      shard = this.shards[h >>> OWNER_SHARD_SHIFT]!;
      if ((shard.size + 1) * 2 > shard.mask + 1) shard.resize(this.allocate((shard.mask + 1) * 2));
      const { slots, mask } = shard;
      let at = h & mask;
      while (slots[at * 4 + 3] !== EMPTY) at = (at + 1) & mask;
      p = at * 4;
    }
    const slots = shard.slots;
    slots[p] = hi;
    slots[p + 1] = lo;
    slots[p + 2] = 0;
    slots[p + 3] = HELD;
    shard.size++;
    this.count++;
    this.shard = shard;
    this.at = p;
  }

  /** The cursor entry's owner count. */
  get owners(): number {
    return this.shard.slots[this.at + 2]!;
  }

  set owners(value: number) {
    this.shard.slots[this.at + 2] = value;
  }

  /** Whether the cursor entry's fingerprint is in the filter. */
  get resident(): boolean {
    return this.shard.slots[this.at + 3] === RESIDENT;
  }

  set resident(value: boolean) {
    this.shard.slots[this.at + 3] = value ? RESIDENT : HELD;
  }

  /** Removes the cursor entry (backward-shift deletion: the probe runs after it close up). */
  remove(): void {
    const shard = this.shard;
    const { slots, mask } = shard;
    this.missShard = undefined;
    let hole = this.at >>> 2;
    let at = hole;
    for (;;) {
      at = (at + 1) & mask;
      const p = at * 4;
      if (slots[p + 3] === EMPTY) break;
      const home = mixU64(slots[p]!, slots[p + 1]!) & mask;
      // The entry at `at` may fill the hole when its home is not cyclically within (hole, at].
      if (((at - home) & mask) >= ((at - hole) & mask)) {
        slots.copyWithin(hole * 4, p, p + 4);
        hole = at;
      }
    }
    slots[hole * 4 + 3] = EMPTY;
    shard.size--;
    this.count--;
    const capacity = mask + 1;
    if (capacity > MIN_SHARD_CAPACITY && shard.size * 8 < capacity) shard.resize(this.allocate(capacity / 2));
  }

  /** Entries whose fingerprint is not in the filter. */
  countNonResident(): number {
    let n = 0;
    for (const shard of this.shards) {
      const slots = shard.slots;
      for (let p = 3; p < slots.length; p += 4) if (slots[p] === HELD) n++;
    }
    return n;
  }
}

/** The fewest entries a lineage is made with. */
const MIN_LINEAGE_ENTRIES = 4;

/**
 * One member's lineage: external block hash -> canonical sequence hash, both
 * u64 (hi, lo), iterated in insertion order as a Map is (a Cleared event
 * removes a member's blocks in that order, and which fingerprint copy a
 * removal takes depends on it). Entries are appended to typed arrays; a
 * deleted one is marked dead and skipped, and the arrays are compacted when
 * they fill up (or become sparse), keeping the order. An index of entry
 * positions (linear probing, backward-shift deletion) finds a key.
 *
 * An index word is the entry's position + 1 in its low bits (those of the
 * index mask: the index has twice as many slots as there are entries, so the
 * position fits) and the key hash's bits above the mask in the rest, so that
 * a probe passes over another key's slot without reading its entry: most
 * lookups of a key that is absent (every new block's) read the index alone.
 */
export class LineageMap {
  /** Per entry: key hi, key lo, value hi, value lo. */
  private entries: Uint32Array;
  private dead: Uint8Array;
  /** Per index slot: 0 when empty, else entry position + 1 | the key hash's bits above the mask (see the class comment). */
  private index: Int32Array;
  private mask: number;
  /** Entries appended (live and dead). */
  private used = 0;
  private live = 0;
  /** Set by `find`: the value found and its entry. */
  valueHi = 0;
  valueLo = 0;
  private slot = 0;

  constructor() {
    this.entries = new Uint32Array(MIN_LINEAGE_ENTRIES * 4);
    this.dead = new Uint8Array(MIN_LINEAGE_ENTRIES);
    this.index = new Int32Array(MIN_LINEAGE_ENTRIES * 2);
    this.mask = this.index.length - 1;
  }

  get size(): number {
    return this.live;
  }

  /** Entries appended so far, dead ones included: iterate positions 0..end with `isLive`. */
  get end(): number {
    return this.used;
  }

  isLive(position: number): boolean {
    return this.dead[position] === 0;
  }

  keyHi(position: number): number {
    return this.entries[position * 4]!;
  }

  keyLo(position: number): number {
    return this.entries[position * 4 + 1]!;
  }

  /** The index slot where a probe for a key of hash `hash` starts, read for its memory only (as OwnerTable.peek). */
  peek(hash: number): number {
    return this.index[hash & this.mask]!;
  }

  /**
   * Looks (hi, lo) up; when present, its value is left in `valueHi` /
   * `valueLo` (u32s). `hash` is `mixU64(hi, lo)`, for a caller that has it
   * already. The halves may come as u32s or as int32s of the same bits (see
   * asInt32).
   */
  find(hiBits: number, loBits: number, hash = mixU64(hiBits, loBits)): boolean {
    const hi = hiBits >>> 0;
    const lo = loBits >>> 0;
    const { entries, index, mask } = this;
    const tag = hash & ~mask;
    let slot = hash & mask;
    for (;;) {
      const word = index[slot]!;
      if (word === 0) return false;
      if ((word & ~mask) === tag) {
        const p = ((word & mask) - 1) * 4;
        if (entries[p + 1] === lo && entries[p] === hi) {
          this.valueHi = entries[p + 2]!;
          this.valueLo = entries[p + 3]!;
          this.slot = slot;
          return true;
        }
      }
      slot = (slot + 1) & mask;
    }
  }

  /** Maps (hi, lo) to (valueHi, valueLo): in place when present, as the newest entry otherwise (Map.set). */
  set(hi: number, lo: number, valueHi: number, valueLo: number): void {
    if (this.find(hi, lo)) {
      const p = ((this.index[this.slot]! & this.mask) - 1) * 4;
      this.entries[p + 2] = valueHi;
      this.entries[p + 3] = valueLo;
      return;
    }
    this.add(hi, lo, valueHi, valueLo);
  }

  /** Adds (hi, lo), which must be absent (a `find` just said so), as the newest entry; `hash` as for `find`. */
  add(hi: number, lo: number, valueHi: number, valueLo: number, hash = mixU64(hi, lo)): void {
    if (this.used === this.dead.length) this.makeRoom();
    const position = this.used++;
    const p = position * 4;
    const entries = this.entries;
    entries[p] = hi;
    entries[p + 1] = lo;
    entries[p + 2] = valueHi;
    entries[p + 3] = valueLo;
    this.dead[position] = 0;
    this.place(hash, position);
    this.live++;
  }

  /** Removes (hi, lo); false when absent. Positions of the other entries do not move. */
  delete(hi: number, lo: number): boolean {
    if (!this.find(hi, lo)) return false;
    const { entries, index, mask } = this;
    this.dead[(index[this.slot]! & mask) - 1] = 1;
    this.live--;
    let hole = this.slot;
    let at = hole;
    for (;;) {
      at = (at + 1) & mask;
      const word = index[at]!;
      if (word === 0) break;
      const p = ((word & mask) - 1) * 4;
      const home = mixU64(entries[p]!, entries[p + 1]!) & mask;
      if (((at - home) & mask) >= ((at - hole) & mask)) {
        index[hole] = word;
        hole = at;
      }
    }
    index[hole] = 0;
    return true;
  }

  /**
   * Gives memory back once most entries are gone (positions change, the order
   * does not). Not while anyone walks positions: the state calls it only
   * after an event is done with the lineage.
   */
  compactIfSparse(): void {
    if (this.dead.length > MIN_LINEAGE_ENTRIES && this.live * 4 < this.dead.length) {
      let capacity = MIN_LINEAGE_ENTRIES;
      while (capacity < this.live * 2) capacity *= 2;
      this.rebuild(capacity);
    }
  }

  /** The entries are full: compact when a quarter or more are dead, otherwise double. */
  private makeRoom(): void {
    const capacity = this.dead.length;
    this.rebuild(this.live * 4 <= capacity * 3 ? capacity : capacity * 2);
  }

  /** Live entries, in order, into arrays of `capacity` (a power of two) entries, and a fresh index. */
  private rebuild(capacity: number): void {
    const { entries, dead, used } = this;
    const next = new Uint32Array(capacity * 4);
    let n = 0;
    if (this.live === used) {
      next.set(entries.subarray(0, used * 4));
      n = used;
    } else {
      for (let position = 0; position < used; position++) {
        if (dead[position] !== 0) continue;
        const p = position * 4;
        const q = n * 4;
        next[q] = entries[p]!;
        next[q + 1] = entries[p + 1]!;
        next[q + 2] = entries[p + 2]!;
        next[q + 3] = entries[p + 3]!;
        n++;
      }
    }
    this.entries = next;
    this.dead = new Uint8Array(capacity);
    this.used = n;
    this.index = new Int32Array(capacity * 2);
    this.mask = this.index.length - 1;
    for (let position = 0; position < n; position++) this.place(mixU64(next[position * 4]!, next[position * 4 + 1]!), position);
  }

  private place(hash: number, position: number): void {
    const { index, mask } = this;
    let slot = hash & mask;
    while (index[slot] !== 0) slot = (slot + 1) & mask;
    index[slot] = (hash & ~mask) | (position + 1);
  }
}

/**
 * The slots an EventScratchMap starts with: room for events of up to 32
 * blocks without growing. Growing is rare enough that optimized code may
 * not expect it (a state made later then deoptimizes on its first event).
 */
const SCRATCH_SLOTS = 64;

/**
 * A map of u64 -> u64 for the span of one event (a Stored event's own
 * blocks, to refuse one block hash given two sequences), emptied in O(1) by
 * moving to a new generation: the arrays are kept for the next event.
 */
export class EventScratchMap {
  private keyHi = new Uint32Array(SCRATCH_SLOTS);
  private keyLo = new Uint32Array(SCRATCH_SLOTS);
  private valHi = new Uint32Array(SCRATCH_SLOTS);
  private valLo = new Uint32Array(SCRATCH_SLOTS);
  private stamp = new Int32Array(SCRATCH_SLOTS);
  private mask = SCRATCH_SLOTS - 1;
  private generation = 1;
  valueHi = 0;
  valueLo = 0;

  /** Empties the map, with room for `n` keys without growing. */
  reset(n: number): void {
    let capacity = this.stamp.length;
    if (n * 2 > capacity) {
      while (n * 2 > capacity) capacity *= 2;
      this.keyHi = new Uint32Array(capacity);
      this.keyLo = new Uint32Array(capacity);
      this.valHi = new Uint32Array(capacity);
      this.valLo = new Uint32Array(capacity);
      this.stamp = new Int32Array(capacity);
      this.mask = capacity - 1;
      this.generation = 1;
      return;
    }
    if (this.generation === 0x7fff_ffff) {
      this.stamp.fill(0);
      this.generation = 0;
    }
    this.generation++;
  }

  /** Looks (hi, lo) up; when present, its value is left in `valueHi` / `valueLo`. */
  find(hi: number, lo: number): boolean {
    const { stamp, mask, generation } = this;
    let at = mixU64(hi, lo) & mask;
    while (stamp[at] === generation) {
      if (this.keyLo[at] === lo && this.keyHi[at] === hi) {
        this.valueHi = this.valHi[at]!;
        this.valueLo = this.valLo[at]!;
        return true;
      }
      at = (at + 1) & mask;
    }
    return false;
  }

  /**
   * Looks (hi, lo) up as `find` does; when absent, adds it with (valueHi,
   * valueLo) as `set` would, in the same probe. `hash` is `mixU64(hi, lo)`.
   */
  findOrAdd(hi: number, lo: number, valueHi: number, valueLo: number, hash = mixU64(hi, lo)): boolean {
    const { stamp, mask, generation, keyHi, keyLo } = this;
    let at = hash & mask;
    while (stamp[at] === generation) {
      if (keyLo[at] === lo && keyHi[at] === hi) {
        this.valueHi = this.valHi[at]!;
        this.valueLo = this.valLo[at]!;
        return true;
      }
      at = (at + 1) & mask;
    }
    stamp[at] = generation;
    keyHi[at] = hi;
    keyLo[at] = lo;
    this.valHi[at] = valueHi;
    this.valLo[at] = valueLo;
    return false;
  }

  /** Sets (hi, lo) -> (valueHi, valueLo); at most the `n` keys of the last reset. */
  set(hi: number, lo: number, valueHi: number, valueLo: number): void {
    const { stamp, mask, generation } = this;
    let at = mixU64(hi, lo) & mask;
    while (stamp[at] === generation && !(this.keyLo[at] === lo && this.keyHi[at] === hi)) at = (at + 1) & mask;
    stamp[at] = generation;
    this.keyHi[at] = hi;
    this.keyLo[at] = lo;
    this.valHi[at] = valueHi;
    this.valLo[at] = valueLo;
  }
}
