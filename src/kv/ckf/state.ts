/**
 * The per-datacenter CKF producer state (B.4): exact ownership over a packed
 * lane. The filter holds one fingerprint per *canonical* sequence hash that
 * at least one (worker, rank) member owns; ownership is counted exactly, so
 * the fingerprint is inserted on the 0 -> 1 transition and removed on 1 -> 0,
 * and a member's own block ids ("external" hashes) map to canonical hashes
 * through that member's lineage.
 *
 * Events carry hashes as bigints; each crosses to (hi, lo) u32 halves once,
 * and everything after (the chain hash, the lineage and ownership tables,
 * the filter) works on the halves, so applying a block allocates nothing.
 */
import { CHAIN_XXH3_SEED } from "../hash/index.js";
import { BarrierCopy } from "./barrier-copy.js";
import { ckfConfig, formatIdentity, validateCkfConfig, type CkfConfig, type CkfConfigInit, type DcCkfFormatIdentity } from "./config.js";
import { DirtyWindow } from "./dirty.js";
import { CkfError, describeValue } from "./errors.js";
import { residencyGate, type KvCacheEventData, type RouterEvent, type StoredBlock } from "./events.js";
import { ColumnBatch, type DcCkfPublicationBatch } from "./identity.js";
import { CkfLane } from "./lane.js";
import { asInt32, hi32, isU32, isU64, joinU64, lo32 } from "./u64.js";
import { EventScratchMap, LineageMap, mixU64, OwnerTable } from "./u64-tables.js";
import { Xxh3Of16 } from "./xxh3-16.js";

/** One canonical hash's owners; `resident` is whether its fingerprint is in the filter. */
export interface CanonicalOwnership {
  readonly owners: number;
  readonly resident: boolean;
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

/** What the application under way is doing (`phase`). */
const IDLE = 0;
/** A Stored event's hashes being chained and its mappings checked: nothing has changed yet. */
const STORED_CHECK = 1;
/** A Stored event's blocks being owned and admitted. */
const STORED_OWN = 2;
const REMOVING = 3;
const CLEARING = 4;

const NO_BLOCKS: readonly StoredBlock[] = Object.freeze([]);

/**
 * Blocks a Stored event's check and ownership read ahead at a time (see
 * prepareBlocks): enough for the cache misses of a window to overlap, few
 * enough that its lines are still cached when the block's turn comes and
 * that the work between two pauses stays a few blocks' worth.
 */
const PREPARE_WINDOW = 16;
/**
 * A Stored event of at most this many blocks has its ownership slots and
 * lane buckets read with the check's window, beside the lineage lines: a few
 * hundred lines, still cached when the ownership reaches them. A longer
 * event has them read a window ahead of the ownership instead.
 */
const SHORT_EVENT = 64;

/** Splits a bigint into halves without BigInt arithmetic (see u64.ts): one store, two reads. */
const SPLIT_U64 = new BigUint64Array(1);
const SPLIT_U32 = new Uint32Array(SPLIT_U64.buffer);

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
  private readonly members = new Map<bigint, Map<number, LineageMap>>();
  private readonly owners = new OwnerTable();
  /** The barrier copy under way, if any (beginBarrierCopy). */
  private copy: BarrierCopy | undefined;
  private readonly chain = new Xxh3Of16(CHAIN_XXH3_SEED);
  /** A Stored event's own block hash -> canonical hash, to refuse one block hash given two sequences. */
  private readonly batch = new EventScratchMap();
  /**
   * Per block of the event under way, four u32s: its tokens hash as (hi, lo)
   * halves (its canonical hash once chained), and its block hash (a Removed
   * event's hash) as halves. The shape check fills it, so each bigint is read
   * and split once; only one event applies at a time, so one buffer serves.
   */
  private keys = new Uint32Array(128);
  /** Per block of a Stored event: mixU64 of its block hash, computed once for the lineage and the scratch map. */
  private externalMixes = new Int32Array(32);
  /** Per block of that event: 1 when its block hash was in neither the lineage nor earlier in the event. */
  private fresh = new Uint8Array(32);
  /** Per block of that event, once checked: mixU64 of its canonical hash (the ownership table's key hash). */
  private canonicalMixes = new Int32Array(32);
  /** Per block of that event, once checked: its fingerprint and bucketA in the lane. */
  private fingerprints = new Int32Array(32);
  private homeBuckets = new Int32Array(32);
  /** What the reads made only to bring table lines into cache returned; kept so that they are not optimized away. */
  private touched = 0;
  /**
   * The application under way (applyEventUntil): its phase, its member and
   * where it is, so that it can stop at a pause and go on from there later.
   */
  private phase = IDLE;
  private stepWorker = 0n;
  private stepRank = 0;
  private stepLineage: LineageMap | undefined = undefined;
  private stepBlocks: readonly StoredBlock[] = NO_BLOCKS;
  /** Blocks or hashes of the event, or the lineage's end for a Cleared one. */
  private stepCount = 0;
  /** The next block, hash or lineage position. */
  private stepAt = 0;
  private stepError: CkfError | undefined = undefined;
  /** The Stored event under way: whether its first block chains on a parent, (parentHi, parentLo). */
  private chained = false;
  private parentHi = 0;
  private parentLo = 0;
  /** Blocks of that event prepareBlocks has done: their canonical hashes and addresses are in the scratch arrays. */
  private prepared = 0;
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
    // Never paused, so never undefined.
    return this.applyEventUntil(event, NEVER)!;
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
   * it to release the state. It is applyEventUntil and continueEvent in a
   * generator.
   */
  applyEventInSteps(event: RouterEvent, pause: PauseCheck): ApplySteps {
    this.assertNotStepping();
    return this.eventSteps(event, pause);
  }

  private *eventSteps(event: RouterEvent, pause: PauseCheck): ApplySteps {
    let outcome = this.applyEventUntil(event, pause);
    try {
      while (outcome === undefined) {
        yield;
        outcome = this.continueEvent(pause);
      }
    } finally {
      if (outcome === undefined) this.abandonEvent();
    }
    return outcome;
  }

  /**
   * The stepped application without a generator (what applyEventInSteps
   * runs, and what a caller that rarely pauses uses to spare one per event):
   * applies `event` until it is done, or until `pause` says true at one of the
   * points where the generator would yield. Returns the outcome once the
   * event is done; undefined when it paused, and then `continueEvent(pause)`
   * goes on from there, as the generator's `next()` does, until it returns
   * the outcome. `abandonEvent()` releases the state with the event partly
   * applied. Throws while another application is unfinished.
   */
  applyEventUntil(event: RouterEvent, pause: PauseCheck): ApplyOutcome | undefined {
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
    const invalid = this.checkEvent(event);
    if (invalid !== undefined) return { firstError: invalid, publication: undefined };
    this.pending++;
    const data = event.data;
    this.stepWorker = event.workerId;
    this.stepRank = event.dpRank;
    this.stepError = undefined;
    this.stepping = true;
    switch (data.kind) {
      case "stored":
        this.beginStored(data);
        break;
      case "removed":
        this.stepLineage = this.members.get(event.workerId)?.get(event.dpRank);
        this.stepCount = data.blockHashes.length;
        this.stepAt = 0;
        this.phase = REMOVING;
        break;
      case "cleared":
        this.beginClear();
        break;
    }
    return this.run(pause);
  }

  /** Goes on with the application applyEventUntil paused; the same contract. Throws when none is under way. */
  continueEvent(pause: PauseCheck): ApplyOutcome | undefined {
    if (!this.stepping) throw new Error("DcCkfState: no event is being applied in steps");
    return this.run(pause);
  }

  /** Releases the state from an unfinished application, leaving its event partly applied; nothing when none is under way. */
  abandonEvent(): void {
    if (this.stepping) this.releaseSteps();
  }

  /** Runs the application's phases until it pauses (undefined) or is done (its outcome). */
  private run(pause: PauseCheck): ApplyOutcome | undefined {
    try {
      for (;;) {
        switch (this.phase) {
          case STORED_CHECK:
            if (!this.checkStored(pause)) return undefined;
            break;
          case STORED_OWN:
            if (!this.ownStored(pause)) return undefined;
            break;
          case REMOVING:
            if (!this.removeHashes(pause)) return undefined;
            break;
          case CLEARING:
            if (!this.clearLineage(pause)) return undefined;
            break;
          default:
            return this.endEvent();
        }
      }
    } catch (error) {
      this.releaseSteps();
      throw error;
    }
  }

  private endEvent(): ApplyOutcome {
    const error = this.stepError;
    this.releaseSteps();
    const publication = this.pending >= this.config.publishEveryNEvents ? this.drainPublication() : undefined;
    return error === undefined && publication === undefined ? NOTHING : { firstError: error, publication };
  }

  /** Ends the application under way (done or abandoned): drops what it held of the event. */
  private releaseSteps(): void {
    this.stepping = false;
    this.phase = IDLE;
    this.stepLineage = undefined;
    this.stepBlocks = NO_BLOCKS;
    this.stepError = undefined;
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
    const { columns, changed, netReverted } = this.window.drain(this.materialize);
    this.distinctTouched += changed + netReverted;
    this.netReverted += netReverted;
    this.pending = 0;
    if (columns === undefined || changed === 0) return undefined;
    this.emittedImages += changed;
    return new ColumnBatch(columns);
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

  /**
   * barrierSnapshot in steps: the drained tail, and a copy of the lane as it
   * is now that the caller completes with `step()` across turns while the
   * state goes on changing (BarrierCopy: copy-on-write, so it ends exactly
   * this instant's lane). One at a time; `cancelBarrierCopy` drops it.
   */
  beginBarrierCopy(): [DcCkfPublicationBatch | undefined, BarrierCopy] {
    if (this.copy !== undefined) throw new Error("DcCkfState: a barrier copy is already under way");
    const window = this.window;
    const copy: BarrierCopy = new BarrierCopy(this.lane.slots, () => this.endBarrierCopy(copy));
    this.copy = copy;
    // Every write is seen by the dirty window, then by the copy (which saves the bucket if it has not reached it).
    this.lane.observer = {
      beforeWrite(bucket: number): void {
        window.beforeWrite(bucket);
        copy.beforeWrite(bucket);
      },
    };
    return [this.drainPublication(), copy];
  }

  /** Stops following the lane for the barrier copy under way, if any: its words are incomplete and must not be used. */
  cancelBarrierCopy(): void {
    if (this.copy !== undefined) this.endBarrierCopy(this.copy);
  }

  private endBarrierCopy(copy: BarrierCopy): void {
    if (this.copy !== copy) return;
    this.copy = undefined;
    this.lane.observer = this.window;
  }

  /** Whether the filter claims `seqHash` (a canonical sequence hash); never for a value that is not a u64. */
  contains(seqHash: bigint): boolean {
    return isU64(seqHash) && this.lane.contains(hi32(seqHash), lo32(seqHash));
  }

  /** The owners of a canonical hash, if any. */
  ownership(seqHash: bigint): CanonicalOwnership | undefined {
    if (!isU64(seqHash) || !this.owners.find(hi32(seqHash), lo32(seqHash))) return undefined;
    return { owners: this.owners.owners, resident: this.owners.resident };
  }

  /** The canonical hash a member's external block hash maps to, if any. */
  canonicalOf(workerId: bigint, dpRank: number, externalHash: bigint): bigint | undefined {
    const lineage = this.members.get(workerId)?.get(dpRank);
    if (lineage === undefined || !isU64(externalHash) || !lineage.find(hi32(externalHash), lo32(externalHash))) return undefined;
    return joinU64(lineage.valueHi, lineage.valueLo);
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
    const nonResident = this.owners.countNonResident();
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

  /**
   * A Stored event's start: the parent must be in the member's lineage, a run
   * without one must start at position 0 (either failure ends the event with
   * nothing changed); then the check phase. The shape check has split every
   * hash into `keys`.
   */
  private beginStored(data: Extract<KvCacheEventData, { kind: "stored" }>): void {
    const blocks = data.blocks;
    this.phase = IDLE;
    if (blocks.length === 0) return;
    const workerId = this.stepWorker;
    const dpRank = this.stepRank;
    const lineage = this.members.get(workerId)?.get(dpRank);
    this.chained = false;
    if (data.parentHash !== undefined) {
      SPLIT_U64[0] = data.parentHash;
      if (lineage === undefined || !lineage.find(SPLIT_U32[1]!, SPLIT_U32[0]!)) {
        this.parentNotFound++;
        this.stepError = new CkfError("ParentBlockNotFound", `parent block ${data.parentHash} is not in the lineage of worker ${workerId} rank ${dpRank}`);
        return;
      }
      this.chained = true;
      this.parentHi = lineage.valueHi;
      this.parentLo = lineage.valueLo;
    } else if (data.startPosition !== undefined && data.startPosition !== 0) {
      this.stepError = new CkfError("InvalidBlockSequence", `a run at start position ${data.startPosition} needs a parent block`);
      return;
    }
    this.stepLineage = lineage;
    this.stepBlocks = blocks;
    this.stepCount = blocks.length;
    this.stepAt = 0;
    this.batch.reset(blocks.length);
    this.prepared = 0;
    this.phase = STORED_CHECK;
  }

  /**
   * Chains every canonical hash and checks every mapping before anything
   * changes: a contradicting event is rejected whole (InvalidBlockSequence).
   * Pauses after each block; false when paused.
   */
  private checkStored(pause: PauseCheck): boolean {
    const n = this.stepCount;
    const lineage = this.stepLineage;
    const keys = this.keys;
    const mixes = this.externalMixes;
    const fresh = this.fresh;
    const batch = this.batch;
    for (let i = this.stepAt; i < n; i++) {
      if (i === this.prepared) this.prepareBlocks(i, Math.min(n, i + PREPARE_WINDOW));
      const k = i * 4;
      const hi = keys[k]!;
      const lo = keys[k + 1]!;
      const externalHi = keys[k + 2]!;
      const externalLo = keys[k + 3]!;
      const mix = mixes[i]!;
      let conflict: boolean;
      if (lineage !== undefined && lineage.find(externalHi, externalLo, mix)) {
        conflict = lineage.valueHi !== hi || lineage.valueLo !== lo;
        fresh[i] = 0;
      } else if (batch.findOrAdd(externalHi, externalLo, hi, lo, mix)) {
        // An earlier block of this event has the same block hash. (One the lineage maps needs no entry
        // here: a later repeat finds it in the lineage again, checked against the same sequence.)
        conflict = batch.valueHi !== hi || batch.valueLo !== lo;
        fresh[i] = 0;
      } else {
        conflict = false;
        fresh[i] = 1;
      }
      if (conflict) {
        this.stepError = new CkfError(
          "InvalidBlockSequence",
          `block ${this.stepBlocks[i]!.blockHash} of worker ${this.stepWorker} rank ${this.stepRank} is already mapped to another sequence`,
        );
        this.phase = IDLE;
        return true;
      }
      // Nothing has changed yet; a pause here only delays the rest of the check.
      if (pause()) {
        this.stepAt = i + 1;
        return false;
      }
    }
    if (lineage === undefined) this.stepLineage = this.addMember(this.stepWorker, this.stepRank);
    this.stepAt = 0;
    this.phase = STORED_OWN;
    return true;
  }

  /**
   * Blocks from..to-1 of the Stored event under way, ahead of the check: each
   * canonical hash (the tokens hash chained onto the previous block's, or onto
   * the event's parent) replaces the tokens hash in `keys`, with the block
   * hash's mix, the canonical hash's mix and its lane address beside it; and
   * one read of each lineage index line the check will probe first and, for a
   * short event, of what the ownership will touch (touchOwned). Read in loops
   * of reads only, the blocks' lines miss the cache together, where probing
   * one block after another waits for each in turn. Reads and scratch only:
   * nothing changes.
   */
  private prepareBlocks(from: number, to: number): void {
    this.touchLineage(from, to);
    this.chainBlocks(from, to);
    this.addressBlocks(from, to);
    if (this.stepCount <= SHORT_EVENT) this.touchOwned(from, to);
    this.prepared = to;
  }

  /**
   * The block hash mixes of blocks from..to-1, and one read of the lineage
   * index line each one's check probes first. They do not depend on the
   * chain, so these misses are under way while the chain is hashed.
   */
  private touchLineage(from: number, to: number): void {
    const keys = this.keys;
    const mixes = this.externalMixes;
    for (let i = from; i < to; i++) mixes[i] = mixU64(keys[i * 4 + 2]!, keys[i * 4 + 3]!);
    const lineage = this.stepLineage;
    if (lineage === undefined) return;
    let touched = 0;
    for (let i = from; i < to; i++) touched ^= lineage.peek(mixes[i]!);
    this.touched ^= touched;
  }

  /**
   * The canonical hashes of blocks from..to-1 in place of their tokens
   * hashes. Each hash waits for the one before, so this loop does that alone:
   * the work that does not feed the chain (addressBlocks) runs apart, as one
   * independent step per block.
   */
  private chainBlocks(from: number, to: number): void {
    const keys = this.keys;
    const chain = this.chain;
    let i = from;
    // Without a parent, the event's first block's canonical hash is its tokens hash.
    if (i === 0 && !this.chained) i = 1;
    let parentHi = i > 0 ? keys[i * 4 - 4]! : this.parentHi;
    let parentLo = i > 0 ? keys[i * 4 - 3]! : this.parentLo;
    for (; i < to; i++) {
      const k = i * 4;
      chain.hash(asInt32(parentHi), asInt32(parentLo), asInt32(keys[k]!), asInt32(keys[k + 1]!));
      parentHi = chain.hi;
      parentLo = chain.lo;
      keys[k] = parentHi;
      keys[k + 1] = parentLo;
    }
  }

  /** Blocks from..to-1, once chained: each canonical hash's mix (the ownership key hash), fingerprint and bucketA. */
  private addressBlocks(from: number, to: number): void {
    const keys = this.keys;
    const ownerMixes = this.canonicalMixes;
    const fingerprints = this.fingerprints;
    const homeBuckets = this.homeBuckets;
    const lane = this.lane;
    for (let i = from; i < to; i++) {
      const hi = keys[i * 4]!;
      const lo = keys[i * 4 + 1]!;
      ownerMixes[i] = mixU64(hi, lo);
      lane.address(asInt32(hi), asInt32(lo));
      fingerprints[i] = lane.keyFingerprint;
      homeBuckets[i] = lane.keyBucket;
    }
  }

  /**
   * Owns each checked block: a new mapping adds an owner and admits the
   * fingerprint when it is not resident; a known one is a re-offer. Pauses
   * before each block but the first (a failed insert has rolled back by
   * then); false when paused.
   */
  private ownStored(pause: PauseCheck): boolean {
    const n = this.stepCount;
    const lineage = this.stepLineage!;
    const keys = this.keys;
    const mixes = this.externalMixes;
    const fresh = this.fresh;
    const owners = this.owners;
    const ownerMixes = this.canonicalMixes;
    const fingerprints = this.fingerprints;
    const homeBuckets = this.homeBuckets;
    // A resumed run does not ask again about the block it paused before.
    const resumedAt = this.stepAt;
    // A short event's lines were read with the check.
    let touchedTo = n <= SHORT_EVENT ? n : resumedAt;
    for (let i = resumedAt; i < n; i++) {
      if (i > resumedAt && pause()) {
        this.stepAt = i;
        return false;
      }
      if (i === touchedTo) {
        touchedTo = Math.min(n, i + PREPARE_WINDOW);
        this.touchOwned(i, touchedTo);
      }
      const k = i * 4;
      const hi = keys[k]!;
      const lo = keys[k + 1]!;
      const externalHi = keys[k + 2]!;
      const externalLo = keys[k + 3]!;
      // A fresh block hash cannot be in the lineage yet: only this event's earlier blocks were added since the check.
      const mapped = fresh[i] === 0 && lineage.find(asInt32(externalHi), asInt32(externalLo), mixes[i]!);
      const ownerMix = ownerMixes[i]!;
      const owned = owners.find(asInt32(hi), asInt32(lo), ownerMix);
      if (mapped && lineage.valueHi === hi && lineage.valueLo === lo) {
        // Re-offer of a known mapping: a cheap retry for a block that once failed admission.
        if (owned && !owners.resident && this.admit(fingerprints[i]!, homeBuckets[i]!, false)) owners.resident = true;
        continue;
      }
      if (!owned) {
        owners.insert(hi, lo, ownerMix);
      } else if (owners.owners >= this.maxOwners) {
        this.stepError ??= new CkfError("OwnershipDegreeOverflow", `sequence ${joinU64(hi, lo)} already has ${owners.owners} owners`);
        continue;
      }
      owners.owners = owners.owners + 1;
      // The check refused a block hash mapped to another sequence: unmapped here, in practice.
      if (mapped) lineage.set(externalHi, externalLo, hi, lo);
      else lineage.add(externalHi, externalLo, hi, lo, mixes[i]!);
      if (owners.resident) continue;
      // Ownership commits even if the filter is full: a later removal must still balance it.
      if (this.admit(fingerprints[i]!, homeBuckets[i]!, true)) {
        owners.resident = true;
      } else {
        this.capacityFailures++;
        this.stepError ??= new CkfError("CapacityExhausted", `no room for sequence ${joinU64(hi, lo)} after ${this.config.maxKicks} kicks`);
      }
    }
    if (lineage.size === 0) this.dropMember(this.stepWorker, this.stepRank);
    this.phase = IDLE;
    return true;
  }

  /**
   * One read of the ownership slot, lane bucket and dirty-window word that
   * each of blocks from..to-1 will touch first, for their misses to overlap
   * (see prepareBlocks).
   */
  private touchOwned(from: number, to: number): void {
    const owners = this.owners;
    const lane = this.lane;
    const ownerMixes = this.canonicalMixes;
    const homeBuckets = this.homeBuckets;
    const window = this.window;
    let touched = 0;
    for (let i = from; i < to; i++) {
      const bucket = homeBuckets[i]!;
      touched ^= owners.peek(ownerMixes[i]!) ^ lane.peek(bucket) ^ window.peek(bucket);
    }
    this.touched ^= touched;
  }

  /** A Removed event's hashes, one mapping each; pauses after each; false when paused. */
  private removeHashes(pause: PauseCheck): boolean {
    const n = this.stepCount;
    const lineage = this.stepLineage;
    const keys = this.keys;
    for (let i = this.stepAt; i < n; i++) {
      const failed = this.removeMapping(lineage, keys[i * 4 + 2]!, keys[i * 4 + 3]!);
      this.stepError ??= failed;
      if (pause()) {
        this.stepAt = i + 1;
        return false;
      }
    }
    if (lineage !== undefined && lineage.size === 0) this.dropMember(this.stepWorker, this.stepRank);
    else lineage?.compactIfSparse();
    this.phase = IDLE;
    return true;
  }

  /** Inserts one fingerprint (its `lane.address`); a failed insert leaves neither the lane nor the dirty window changed. */
  private admit(fingerprint: number, bucketA: number, relocate: boolean): boolean {
    const mark = this.window.mark();
    if (this.lane.insertAt(fingerprint, bucketA, relocate)) {
      this.physicalTouches += this.lane.lastWrites;
      return true;
    }
    this.window.rollbackTo(mark);
    return false;
  }

  /** Drops one mapping of a member (B.4 Removed); unknown hashes are counted no-ops. */
  private removeMapping(lineage: LineageMap | undefined, externalHi: number, externalLo: number): CkfError | undefined {
    if (lineage === undefined || !lineage.find(externalHi, externalLo)) {
      this.unknownRemovals++;
      return undefined;
    }
    const hi = lineage.valueHi;
    const lo = lineage.valueLo;
    lineage.delete(externalHi, externalLo);
    const owners = this.owners;
    if (!owners.find(hi, lo)) return new CkfError("IndexerInvariantViolation", `sequence ${joinU64(hi, lo)} is mapped but has no owners`);
    if (owners.owners > 1) {
      owners.owners = owners.owners - 1;
      return undefined;
    }
    const resident = owners.resident;
    owners.remove();
    if (!resident) return undefined;
    try {
      this.lane.remove(hi, lo);
      this.physicalTouches += this.lane.lastWrites;
      return undefined;
    } catch (error) {
      return error as CkfError;
    }
  }

  /** Removes every mapping of one member (removeRank, removeWorker): the Cleared application, run in one go. */
  private clearMember(workerId: bigint, dpRank: number): CkfError | undefined {
    this.stepWorker = workerId;
    this.stepRank = dpRank;
    this.stepError = undefined;
    this.beginClear();
    this.clearLineage(NEVER);
    const error = this.stepError;
    this.releaseSteps();
    return error;
  }

  /** A Cleared application of the member (stepWorker, stepRank): its lineage's entries there are now. */
  private beginClear(): void {
    const lineage = this.members.get(this.stepWorker)?.get(this.stepRank);
    this.stepLineage = lineage;
    // In insertion order, over the entries there now: removals only mark entries dead, nothing is added meanwhile.
    this.stepCount = lineage === undefined ? 0 : lineage.end;
    this.stepAt = 0;
    this.phase = lineage === undefined ? IDLE : CLEARING;
  }

  /** Drops the member's mappings, pausing after each; then the member. False when paused. */
  private clearLineage(pause: PauseCheck): boolean {
    const lineage = this.stepLineage!;
    const end = this.stepCount;
    for (let position = this.stepAt; position < end; position++) {
      if (!lineage.isLive(position)) continue;
      const failed = this.removeMapping(lineage, lineage.keyHi(position), lineage.keyLo(position));
      this.stepError ??= failed;
      if (pause()) {
        this.stepAt = position + 1;
        return false;
      }
    }
    this.dropMember(this.stepWorker, this.stepRank);
    this.phase = IDLE;
    return true;
  }

  /**
   * The shape and range checks of an event that passed the residency gate (so
   * it is an object), in one pass over its blocks, which also splits each
   * block's hashes into `keys`: every bigint of the event is read once.
   * Events come from decoders and other JavaScript, where the type is a
   * hope: a missing block list or a null block would otherwise throw a bare
   * TypeError halfway through applying, and a hash outside u64 would alias
   * another key after the (hi, lo) split. `eventId` and `mmExtraInfo` are
   * carried, never read, so they are not checked.
   */
  private checkEvent(event: RouterEvent): CkfError | undefined {
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
        const keys = this.scratchFor(blocks.length);
        for (let i = 0; i < blocks.length; i++) {
          const block: unknown = blocks[i];
          if (typeof block !== "object" || block === null) return invalidEvent(`block ${i} is ${describeValue(block)}, not an object`);
          const { blockHash, tokensHash } = block as Partial<StoredBlock>;
          if (!isU64(blockHash) || !isU64(tokensHash)) {
            return invalidEvent(`block ${i}: block hash ${describeValue(blockHash)} / tokens hash ${describeValue(tokensHash)} is not a u64`);
          }
          const k = i * 4;
          SPLIT_U64[0] = tokensHash;
          keys[k] = SPLIT_U32[1]!;
          keys[k + 1] = SPLIT_U32[0]!;
          SPLIT_U64[0] = blockHash;
          keys[k + 2] = SPLIT_U32[1]!;
          keys[k + 3] = SPLIT_U32[0]!;
        }
        return undefined;
      }
      case "removed": {
        const hashes = body.blockHashes;
        if (!Array.isArray(hashes)) return invalidEvent(`a Removed event's block hashes are ${describeValue(hashes)}, not an array`);
        const keys = this.scratchFor(hashes.length);
        for (let i = 0; i < hashes.length; i++) {
          const hash: unknown = hashes[i];
          if (!isU64(hash)) return invalidEvent(`removed block hash ${i} (${describeValue(hash)}) is not a u64`);
          SPLIT_U64[0] = hash;
          keys[i * 4 + 2] = SPLIT_U32[1]!;
          keys[i * 4 + 3] = SPLIT_U32[0]!;
        }
        return undefined;
      }
      case "cleared":
        return undefined;
      default:
        return invalidEvent(`unknown event kind ${describeValue(body.kind)}`);
    }
  }

  /** The per-block scratch arrays, with room for `n` blocks. */
  private scratchFor(n: number): Uint32Array {
    if (this.fresh.length < n) {
      const capacity = Math.max(n, this.fresh.length * 2);
      this.fresh = new Uint8Array(capacity);
      this.externalMixes = new Int32Array(capacity);
      this.canonicalMixes = new Int32Array(capacity);
      this.fingerprints = new Int32Array(capacity);
      this.homeBuckets = new Int32Array(capacity);
      this.keys = new Uint32Array(capacity * 4);
    }
    return this.keys;
  }

  private addMember(workerId: bigint, dpRank: number): LineageMap {
    let ranks = this.members.get(workerId);
    if (ranks === undefined) {
      ranks = new Map();
      this.members.set(workerId, ranks);
    }
    const lineage = new LineageMap();
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

function invalidEvent(message: string): CkfError {
  return new CkfError("InvalidEvent", message);
}
