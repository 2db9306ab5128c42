import { BoundedQueue } from "../util/index.js";

/** One member of a pool, e.g. an encode worker. */
export interface Member {
  /** Stable identity, unique in a membership. */
  readonly id: string;
  /** `HOST:PORT` to reach it. */
  readonly address: string;
  readonly metadata: Readonly<Record<string, string>>;
}

/**
 * A committed view of a pool. `generation` is a u64 (bigint, as every u64
 * here): it grows with each commit, and etcd revisions, which may back it,
 * are 64-bit. Members are sorted by id.
 */
export interface Membership {
  readonly generation: bigint;
  readonly members: readonly Member[];
}

/** Where a pool's membership comes from: a config file, etcd. */
export interface Resolver {
  /** The view committed last. */
  current(): Membership;
  /**
   * The current view first, then each committed change, until `signal`
   * fires or the resolver is closed (the iteration then ends). A consumer
   * slower than the changes skips to the newest view.
   */
  watch(signal: AbortSignal): AsyncIterable<Membership>;
  /** Ends every watch; `current()` keeps answering the last view. */
  close(): Promise<void>;
}

/** `members` as a committed list: sorted by id, frozen. */
function committedMembers(members: readonly Member[]): readonly Member[] {
  return Object.freeze(
    [...members]
      .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
      .map((m) => Object.freeze({ id: m.id, address: m.address, metadata: Object.freeze({ ...m.metadata }) })),
  );
}

/** Whether two committed (sorted) lists hold the same members, addresses and metadata. */
function sameMembers(a: readonly Member[], b: readonly Member[]): boolean {
  if (a.length !== b.length) return false;
  return a.every((m, i) => {
    const o = b[i]!;
    if (m.id !== o.id || m.address !== o.address) return false;
    const keys = Object.keys(m.metadata);
    return keys.length === Object.keys(o.metadata).length && keys.every((k) => Object.hasOwn(o.metadata, k) && o.metadata[k] === m.metadata[k]);
  });
}

/**
 * The latest committed view and its watchers. Each watch has a one-slot
 * queue that a commit replaces (conflates) with the newest view, so a slow
 * watcher skips views in between and never holds a commit back. Resolvers
 * build on it.
 */
export class MembershipCell {
  private view: Membership;
  private readonly watchers = new Set<BoundedQueue<Membership>>();
  private ended = false;

  constructor(members: readonly Member[] = [], generation = 1n) {
    this.view = Object.freeze({ generation, members: committedMembers(members) });
  }

  get closed(): boolean {
    return this.ended;
  }

  current(): Membership {
    return this.view;
  }

  /** Commits `members` as the next generation when they differ from the current view; returns the view now current. */
  commit(members: readonly Member[]): Membership {
    if (this.ended) throw new Error("the resolver is closed");
    const sorted = committedMembers(members);
    if (sameMembers(sorted, this.view.members)) return this.view;
    this.view = Object.freeze({ generation: this.view.generation + 1n, members: sorted });
    for (const queue of this.watchers) queue.replace(this.view);
    return this.view;
  }

  async *watch(signal: AbortSignal): AsyncGenerator<Membership> {
    if (this.ended || signal.aborted) return;
    const queue = new BoundedQueue<Membership>({ maxItems: 1 });
    queue.replace(this.view);
    this.watchers.add(queue);
    try {
      for (;;) {
        let next: IteratorResult<Membership>;
        try {
          next = await queue.next(signal);
        } catch (error) {
          if (signal.aborted) return;
          throw error;
        }
        if (next.done === true) return;
        yield next.value;
      }
    } finally {
      this.watchers.delete(queue);
      queue.close();
    }
  }

  /** Ends every watch (after the view it has not read yet). */
  close(): void {
    this.ended = true;
    for (const queue of this.watchers) queue.close();
  }
}
