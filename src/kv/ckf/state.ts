/**
 * The per-datacenter CKF producer state (B.4): exact ownership over a packed
 * lane. The filter holds one fingerprint per *canonical* sequence hash that
 * at least one (worker, rank) member owns; ownership is counted exactly, so
 * the fingerprint is inserted on the 0 -> 1 transition and removed on 1 -> 0,
 * and a member's own block ids ("external" hashes) map to canonical hashes
 * through that member's lineage.
 *
 * Hashes are bigint at this layer (events carry bigints, Maps key on them);
 * each block crosses to the (hi, lo) filter path once.
 */
import { computeNextSeqHash } from "../hash/index.js";
import { ckfConfig, formatIdentity, validateCkfConfig, type CkfConfig, type CkfConfigInit, type DcCkfFormatIdentity } from "./config.js";
import { DirtyWindow } from "./dirty.js";
import { CkfError, describeValue } from "./errors.js";
import { residencyGate, type KvCacheEventData, type RouterEvent, type StoredBlock } from "./events.js";
import type { DcCkfPublicationBatch } from "./identity.js";
import { CkfLane } from "./lane.js";
import { hi32, isU32, isU64, lo32 } from "./u64.js";

/** One canonical hash's owners; `resident` is whether its fingerprint is in the filter. */
export interface CanonicalOwnership {
  readonly owners: number;
  readonly resident: boolean;
}

interface OwnerEntry {
  owners: number;
  resident: boolean;
}

/** What applying one event (or removing members) did. */
export interface ApplyOutcome {
  /** The first failure; later blocks were still attempted and successful ones stay applied. */
  readonly firstError: CkfError | undefined;
  /** The batch drained at a publication boundary, when one was reached and something changed. */
  readonly publication: DcCkfPublicationBatch | undefined;
}

export interface DcCkfStats {
  /** (worker, rank) members with at least one mapping. */
  readonly members: number;
  /** Mappings over all members (the sum of owner counts). */
  readonly contributions: number;
  /** Distinct canonical hashes owned by anyone. */
  readonly uniqueBlocks: number;
  /** Canonical hashes owned but not in the filter (admission failed for capacity). */
  readonly nonResidentBlocks: number;
  readonly unknownRemovals: number;
  readonly parentNotFound: number;
  readonly capacityFailures: number;
  readonly occupiedBuckets: number;
  readonly occupiedSlots: number;
  readonly pendingEvents: number;
  /** Slot writes by successful inserts and removes (evictions included). */
  readonly physicalTouches: number;
  /** Buckets that entered a dirty window, summed over drained windows. */
  readonly distinctTouchedBuckets: number;
  /** Images in materialized batches. */
  readonly emittedImages: number;
  /** Dirty buckets that drained unchanged. */
  readonly netRevertedBuckets: number;
  /** Bytes of the typed arrays (ownership maps are not counted; the delta table is shared by lanes of one layout). */
  readonly memory: { readonly filterBytes: number; readonly dirtyWindowBytes: number; readonly deltaTableBytes: number };
}

export interface DcCkfStateOptions {
  /** Whether drains yield batches; the relay turns this on once a consumer lease exists. Default true. */
  readonly materialize?: boolean;
  /** Owners per canonical hash before OwnershipDegreeOverflow; u32::MAX, lowered only by tests. */
  readonly maxOwners?: number;
  /**
   * Blocks a Stored event, or block hashes a Removed event, may carry; a
   * longer one is refused whole (EventTooLarge) before anything is read or
   * changed. Default: no limit (the relay sets its `maxBlocksPerEvent`).
   */
  readonly maxBlocksPerEvent?: number;
}

/**
 * Asked after each block (each chained hash, each owned block, each removal)
 * of an application in steps whether to pause there; see applyEventInSteps.
 */
export type PauseCheck = () => boolean;

/** An application in steps: resume it with next() until it is done; its value is the event's outcome. */
export type ApplySteps = Generator<void, ApplyOutcome, void>;

const NOTHING: ApplyOutcome = Object.freeze({ firstError: undefined, publication: undefined });

/** Never pauses: applyEvent runs the stepped application in one go. */
const NEVER: PauseCheck = () => false;

/** Runs steps that never pause to their value. */
function runToEnd<T>(steps: Generator<void, T, void>): T {
  for (;;) {
    const step = steps.next();
    if (step.done === true) return step.value;
  }
}

type Lineage = Map<bigint, bigint>;

/** Shards of the owner table: a power of two. */
const OWNER_SHARDS = 256;

/**
 * A map of u64 keys over OWNER_SHARDS Maps picked by the key's low bits.
 * A Map that outgrows its table rehashes every entry in one call: at a
 * million entries that is tens of milliseconds in which nothing else runs,
 * whatever slices the work around it. Sharded, each rehash is 1/256 of that.
 * Only get, set, delete, size and an unordered walk of the values: nothing
 * reads the owner table in insertion order.
 */
class ShardedMap<V> {
  private readonly shards: Map<bigint, V>[] = Array.from({ length: OWNER_SHARDS }, () => new Map<bigint, V>());
  private count = 0;

  private shard(key: bigint): Map<bigint, V> {
    return this.shards[Number(BigInt.asUintN(8, key))]!;
  }

  get(key: bigint): V | undefined {
    return this.shard(key).get(key);
  }

  set(key: bigint, value: V): void {
    const shard = this.shard(key);
    const size = shard.size;
    shard.set(key, value);
    this.count += shard.size - size;
  }

  delete(key: bigint): void {
    if (this.shard(key).delete(key)) this.count--;
  }

  get size(): number {
    return this.count;
  }

  *values(): Generator<V, void, undefined> {
    for (const shard of this.shards) yield* shard.values();
  }
}

export class DcCkfState {
  readonly config: CkfConfig;
  private readonly lane: CkfLane;
  private readonly window: DirtyWindow;
  private readonly identity: DcCkfFormatIdentity;
  private readonly maxOwners: number;
  private readonly maxBlocksPerEvent: number;
  private materialize: boolean;
  /** An application in steps has started and not finished: nothing else may change the state meanwhile. */
  private stepping = false;
  /** workerId -> dpRank -> external hash -> canonical hash. */
  private readonly members = new Map<bigint, Map<number, Lineage>>();
  private readonly owners = new ShardedMap<OwnerEntry>();
  private pending = 0;
  private unknownRemovals = 0;
  private parentNotFound = 0;
  private capacityFailures = 0;
  private physicalTouches = 0;
  private distinctTouched = 0;
  private emittedImages = 0;
  private netReverted = 0;

  constructor(config: CkfConfig | CkfConfigInit = {}, options: DcCkfStateOptions = {}) {
    this.config = ckfConfig(config);
    const buckets = validateCkfConfig(this.config);
    this.lane = new CkfLane({ seed: this.config.seed, bucketCount: buckets, maxKicks: this.config.maxKicks, lane: 0 });
    this.window = new DirtyWindow(this.lane.slots);
    this.lane.observer = this.window;
    this.identity = formatIdentity(this.config.seed, buckets);
    this.materialize = options.materialize ?? true;
    this.maxOwners = options.maxOwners ?? 0xffff_ffff;
    this.maxBlocksPerEvent = options.maxBlocksPerEvent ?? Number.POSITIVE_INFINITY;
  }

  /**
   * Applies one event: the residency gate, then Stored / Removed / Cleared,
   * then a publication boundary when enough events are pending. Failures are
   * returned, not thrown, whatever the caller passes: the first one is kept,
   * the rest of the event still applies (except where the spec rejects the
   * whole event before mutating, for a malformed event: InvalidEvent, and for
   * one over `maxBlocksPerEvent`: EventTooLarge). It is the stepped
   * application below, run without a pause, so both give the same state and
   * the same outcome for the same events. Throws only while an application in
   * steps is unfinished (a caller's bug).
   */
  applyEvent(event: RouterEvent): ApplyOutcome {
    return runToEnd(this.eventSteps(event, NEVER));
  }

  /**
   * The same application as applyEvent, in steps. The generator asks `pause`
   * after each block of the event (each hash chained and checked, each block
   * owned, each removal, each mapping a Cleared event drops) and yields when
   * it says true; `next()` resumes it, and its value is the event's outcome.
   * A pause changes nothing about what the event does: the same code runs, in
   * the same order, over the same state, because nothing else may change the
   * state until the generator is done: applyEvent, removeRank, removeWorker
   * and another stepped application throw meanwhile. Reads, drains and
   * barrier snapshots may run in a pause and see the event partly applied (a
   * consistent lane: every block admitted so far, none after). A generator
   * dropped before its end leaves the event partly applied; call return() on
   * it to release the state.
   */
  applyEventInSteps(event: RouterEvent, pause: PauseCheck): ApplySteps {
    this.assertNotStepping();
    return this.eventSteps(event, pause);
  }

  private *eventSteps(event: RouterEvent, pause: PauseCheck): ApplySteps {
    this.assertNotStepping();
    // B.4 step 1 comes first: an event for another tier or domain is ignored
    // completely, whatever the rest of its body holds (a Cleared is ignored
    // only when scoped to the cache-owner domain, whatever its tier). The gate
    // reads only the residency fields and the data kind, and refuses
    // (InvalidEvent) an event whose residency fields it cannot read.
    const gate = residencyGate(event);
    if (gate === false) return NOTHING;
    if (gate !== true) return { firstError: gate, publication: undefined };
    const tooLarge = this.checkSize(event);
    if (tooLarge !== undefined) return { firstError: tooLarge, publication: undefined };
    const invalid = checkEvent(event);
    if (invalid !== undefined) return { firstError: invalid, publication: undefined };
    this.pending++;
    const data = event.data;
    let error: CkfError | undefined;
    this.stepping = true;
    try {
      switch (data.kind) {
        case "stored":
          error = yield* this.storedSteps(event.workerId, event.dpRank, data, pause);
          break;
        case "removed": {
          const lineage = this.members.get(event.workerId)?.get(event.dpRank);
          for (const hash of data.blockHashes) {
            const failed = this.removeMapping(lineage, hash);
            error ??= failed;
            if (pause()) yield;
          }
          if (lineage !== undefined && lineage.size === 0) this.dropMember(event.workerId, event.dpRank);
          break;
        }
        case "cleared":
          error = yield* this.clearSteps(event.workerId, event.dpRank, pause);
          break;
      }
    } finally {
      this.stepping = false;
    }
    const publication = this.pending >= this.config.publishEveryNEvents ? this.drainPublication() : undefined;
    return error === undefined && publication === undefined ? NOTHING : { firstError: error, publication };
  }

  /** Whether an application in steps is under way (started, not finished). */
  get applying(): boolean {
    return this.stepping;
  }

  private assertNotStepping(): void {
    if (this.stepping) throw new Error("DcCkfState: an event is being applied in steps; finish it before changing the state otherwise");
  }

  /** EventTooLarge for a Stored or Removed event over maxBlocksPerEvent; read before the event's blocks are. */
  private checkSize(event: RouterEvent): CkfError | undefined {
    const data: unknown = event.data;
    if (typeof data !== "object" || data === null) return undefined;
    const body = data as Partial<Record<string, unknown>>;
    const list = body.kind === "stored" ? body.blocks : body.kind === "removed" ? body.blockHashes : undefined;
    if (!Array.isArray(list) || list.length <= this.maxBlocksPerEvent) return undefined;
    const what = body.kind === "stored" ? "blocks" : "block hashes";
    return new CkfError("EventTooLarge", `a ${String(body.kind)} event of ${list.length} ${what} is over the limit of ${this.maxBlocksPerEvent} per event`);
  }

  /**
   * Ends the current window: the buckets whose value changed since they were
   * first dirtied, in that order. Undefined when nothing changed or
   * materialization is off; either way the window and the pending count reset.
   */
  drainPublication(): DcCkfPublicationBatch | undefined {
    if (this.pending === 0 && this.window.size === 0) return undefined;
    const { images, changed, netReverted } = this.window.drain(this.materialize);
    this.distinctTouched += changed + netReverted;
    this.netReverted += netReverted;
    this.pending = 0;
    if (images.length === 0 || !this.materialize) return undefined;
    this.emittedImages += images.length;
    return Object.freeze({ images: Object.freeze(images) });
  }

  /** Removes every mapping of one member, then drains. */
  removeRank(workerId: bigint, dpRank: number): ApplyOutcome {
    this.assertNotStepping();
    const error = this.clearMember(workerId, dpRank);
    return { firstError: error, publication: this.drainPublication() };
  }

  /** Removes every rank of a worker, then drains. */
  removeWorker(workerId: bigint): ApplyOutcome {
    this.assertNotStepping();
    let error: CkfError | undefined;
    const ranks = this.members.get(workerId);
    if (ranks !== undefined) {
      for (const rank of [...ranks.keys()]) {
        const failed = this.clearMember(workerId, rank);
        error ??= failed;
      }
    }
    return { firstError: error, publication: this.drainPublication() };
  }

  /** Drains whatever is pending. */
  flush(): DcCkfPublicationBatch | undefined {
    return this.drainPublication();
  }

  /**
   * A copy of every bucket word, then the drained tail. The copy already
   * contains the tail's changes: a consumer that installs the copy must not
   * also apply the tail, and one that had the previous state gets there by
   * applying the tail.
   */
  barrierSnapshot(): [DcCkfPublicationBatch | undefined, BigUint64Array] {
    const words = this.lane.words().slice();
    return [this.drainPublication(), words];
  }

  /** Whether the filter claims `seqHash` (a canonical sequence hash); never for a value that is not a u64. */
  contains(seqHash: bigint): boolean {
    return isU64(seqHash) && this.lane.contains(hi32(seqHash), lo32(seqHash));
  }

  /** The owners of a canonical hash, if any. */
  ownership(seqHash: bigint): CanonicalOwnership | undefined {
    const entry = this.owners.get(seqHash);
    return entry === undefined ? undefined : { owners: entry.owners, resident: entry.resident };
  }

  /** The canonical hash a member's external block hash maps to, if any. */
  canonicalOf(workerId: bigint, dpRank: number, externalHash: bigint): bigint | undefined {
    return this.members.get(workerId)?.get(dpRank)?.get(externalHash);
  }

  format(): DcCkfFormatIdentity {
    return this.identity;
  }

  /** A view of the live lane words (not a copy; changes with the state). */
  words(): BigUint64Array {
    return this.lane.words();
  }

  get materializing(): boolean {
    return this.materialize;
  }

  setMaterialization(enabled: boolean): void {
    this.materialize = enabled;
  }

  /** Distinct blocks owned and (worker, rank) members, without the scans stats() makes: cheap enough to read every load window. */
  occupancy(): { readonly uniqueBlocks: number; readonly members: number } {
    let members = 0;
    for (const ranks of this.members.values()) members += ranks.size;
    return { uniqueBlocks: this.owners.size, members };
  }

  stats(): DcCkfStats {
    let members = 0;
    let contributions = 0;
    for (const ranks of this.members.values()) {
      for (const lineage of ranks.values()) {
        members++;
        contributions += lineage.size;
      }
    }
    let nonResident = 0;
    for (const entry of this.owners.values()) if (!entry.resident) nonResident++;
    return {
      members,
      contributions,
      uniqueBlocks: this.owners.size,
      nonResidentBlocks: nonResident,
      unknownRemovals: this.unknownRemovals,
      parentNotFound: this.parentNotFound,
      capacityFailures: this.capacityFailures,
      occupiedBuckets: this.lane.occupiedBuckets(),
      occupiedSlots: this.lane.occupiedSlots(),
      pendingEvents: this.pending,
      physicalTouches: this.physicalTouches,
      distinctTouchedBuckets: this.distinctTouched,
      emittedImages: this.emittedImages,
      netRevertedBuckets: this.netReverted,
      memory: {
        filterBytes: this.lane.byteLength,
        dirtyWindowBytes: this.window.byteLength,
        deltaTableBytes: this.lane.addressing.deltas.byteLength,
      },
    };
  }

  private *storedSteps(workerId: bigint, dpRank: number, data: Extract<KvCacheEventData, { kind: "stored" }>, pause: PauseCheck): Generator<void, CkfError | undefined, void> {
    const blocks = data.blocks;
    if (blocks.length === 0) return undefined;
    let lineage = this.members.get(workerId)?.get(dpRank);
    let parent: bigint | undefined;
    if (data.parentHash !== undefined) {
      parent = lineage?.get(data.parentHash);
      if (parent === undefined) {
        this.parentNotFound++;
        return new CkfError("ParentBlockNotFound", `parent block ${data.parentHash} is not in the lineage of worker ${workerId} rank ${dpRank}`);
      }
    } else if (data.startPosition !== undefined && data.startPosition !== 0) {
      return new CkfError("InvalidBlockSequence", `a run at start position ${data.startPosition} needs a parent block`);
    }
    // Chain every canonical hash and check every mapping before touching anything:
    // a contradicting event is rejected whole.
    const canonicals = new Array<bigint>(blocks.length);
    const batch = new Map<bigint, bigint>();
    for (let i = 0; i < blocks.length; i++) {
      const block = blocks[i]!;
      const canonical = parent === undefined ? block.tokensHash : computeNextSeqHash(parent, block.tokensHash);
      const known = lineage?.get(block.blockHash) ?? batch.get(block.blockHash);
      if (known !== undefined && known !== canonical) {
        return new CkfError(
          "InvalidBlockSequence",
          `block ${block.blockHash} of worker ${workerId} rank ${dpRank} is already mapped to another sequence`,
        );
      }
      batch.set(block.blockHash, canonical);
      canonicals[i] = canonical;
      parent = canonical;
      // Nothing has changed yet; a pause here only delays the rest of the check.
      if (pause()) yield;
    }
    if (lineage === undefined) lineage = this.addMember(workerId, dpRank);
    let error: CkfError | undefined;
    for (let i = 0; i < blocks.length; i++) {
      // Each block is done (or skipped) whole before a pause: a failed insert has rolled back by then.
      if (i > 0 && pause()) yield;
      const external = blocks[i]!.blockHash;
      const canonical = canonicals[i]!;
      let entry = this.owners.get(canonical);
      if (lineage.get(external) === canonical) {
        // Re-offer of a known mapping: a cheap retry for a block that once failed admission.
        if (entry !== undefined && !entry.resident && this.admit(canonical, false)) entry.resident = true;
        continue;
      }
      if (entry === undefined) {
        entry = { owners: 0, resident: false };
        this.owners.set(canonical, entry);
      } else if (entry.owners >= this.maxOwners) {
        error ??= new CkfError("OwnershipDegreeOverflow", `sequence ${canonical} already has ${entry.owners} owners`);
        continue;
      }
      entry.owners++;
      lineage.set(external, canonical);
      if (entry.resident) continue;
      // Ownership commits even if the filter is full: a later removal must still balance it.
      if (this.admit(canonical, true)) {
        entry.resident = true;
      } else {
        this.capacityFailures++;
        error ??= new CkfError("CapacityExhausted", `no room for sequence ${canonical} after ${this.config.maxKicks} kicks`);
      }
    }
    if (lineage.size === 0) this.dropMember(workerId, dpRank);
    return error;
  }

  /** Inserts one fingerprint; a failed insert leaves neither the lane nor the dirty window changed. */
  private admit(canonical: bigint, relocate: boolean): boolean {
    const mark = this.window.mark();
    if (this.lane.insert(hi32(canonical), lo32(canonical), relocate)) {
      this.physicalTouches += this.lane.lastWrites;
      return true;
    }
    this.window.rollbackTo(mark);
    return false;
  }

  /** Drops one mapping of a member (B.4 Removed); unknown hashes are counted no-ops. */
  private removeMapping(lineage: Lineage | undefined, external: bigint): CkfError | undefined {
    const canonical = lineage?.get(external);
    if (lineage === undefined || canonical === undefined) {
      this.unknownRemovals++;
      return undefined;
    }
    lineage.delete(external);
    const entry = this.owners.get(canonical);
    if (entry === undefined) return new CkfError("IndexerInvariantViolation", `sequence ${canonical} is mapped but has no owners`);
    if (entry.owners > 1) {
      entry.owners--;
      return undefined;
    }
    this.owners.delete(canonical);
    if (!entry.resident) return undefined;
    try {
      this.lane.remove(hi32(canonical), lo32(canonical));
      this.physicalTouches += this.lane.lastWrites;
      return undefined;
    } catch (error) {
      return error as CkfError;
    }
  }

  private clearMember(workerId: bigint, dpRank: number): CkfError | undefined {
    return runToEnd(this.clearSteps(workerId, dpRank, NEVER));
  }

  private *clearSteps(workerId: bigint, dpRank: number, pause: PauseCheck): Generator<void, CkfError | undefined, void> {
    const lineage = this.members.get(workerId)?.get(dpRank);
    if (lineage === undefined) return undefined;
    let error: CkfError | undefined;
    for (const external of [...lineage.keys()]) {
      const failed = this.removeMapping(lineage, external);
      error ??= failed;
      if (pause()) yield;
    }
    this.dropMember(workerId, dpRank);
    return error;
  }

  private addMember(workerId: bigint, dpRank: number): Lineage {
    let ranks = this.members.get(workerId);
    if (ranks === undefined) {
      ranks = new Map();
      this.members.set(workerId, ranks);
    }
    const lineage: Lineage = new Map();
    ranks.set(dpRank, lineage);
    return lineage;
  }

  private dropMember(workerId: bigint, dpRank: number): void {
    const ranks = this.members.get(workerId);
    if (ranks === undefined) return;
    ranks.delete(dpRank);
    if (ranks.size === 0) this.members.delete(workerId);
  }
}

/**
 * The shape and range checks of an event that passed the residency gate (so
 * it is an object), in one pass over its blocks. Events come from decoders
 * and other JavaScript, where the type is a hope: a missing block list or a
 * null block would otherwise throw a bare TypeError halfway through applying,
 * and a hash outside u64 would alias another key after the (hi, lo) split.
 * `eventId` and `mmExtraInfo` are carried, never read, so they are not checked.
 */
function checkEvent(event: RouterEvent): CkfError | undefined {
  if (!isU64(event.workerId)) return invalidEvent(`workerId ${describeValue(event.workerId)} is not a u64`);
  if (!isU32(event.dpRank)) return invalidEvent(`dpRank ${describeValue(event.dpRank)} is not a u32`);
  const data: unknown = event.data;
  if (typeof data !== "object" || data === null) return invalidEvent(`event data ${describeValue(data)} is not an object`);
  const body = data as Partial<Record<string, unknown>>;
  switch (body.kind) {
    case "stored": {
      const { parentHash, startPosition, blocks } = body;
      if (parentHash !== undefined && !isU64(parentHash)) return invalidEvent(`parent hash ${describeValue(parentHash)} is not a u64`);
      if (startPosition !== undefined && !isU32(startPosition)) return invalidEvent(`start position ${describeValue(startPosition)} is not a u32`);
      if (!Array.isArray(blocks)) return invalidEvent(`a Stored event's blocks are ${describeValue(blocks)}, not an array`);
      for (let i = 0; i < blocks.length; i++) {
        const block: unknown = blocks[i];
        if (typeof block !== "object" || block === null) return invalidEvent(`block ${i} is ${describeValue(block)}, not an object`);
        const { blockHash, tokensHash } = block as Partial<StoredBlock>;
        if (!isU64(blockHash) || !isU64(tokensHash)) {
          return invalidEvent(`block ${i}: block hash ${describeValue(blockHash)} / tokens hash ${describeValue(tokensHash)} is not a u64`);
        }
      }
      return undefined;
    }
    case "removed": {
      const hashes = body.blockHashes;
      if (!Array.isArray(hashes)) return invalidEvent(`a Removed event's block hashes are ${describeValue(hashes)}, not an array`);
      for (let i = 0; i < hashes.length; i++) {
        const hash: unknown = hashes[i];
        if (!isU64(hash)) return invalidEvent(`removed block hash ${i} (${describeValue(hash)}) is not a u64`);
      }
      return undefined;
    }
    case "cleared":
      return undefined;
    default:
      return invalidEvent(`unknown event kind ${describeValue(body.kind)}`);
  }
}

function invalidEvent(message: string): CkfError {
  return new CkfError("InvalidEvent", message);
}
