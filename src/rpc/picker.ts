/** How the picker tells endpoints apart across rebuilds; identity by default. */
export type EndpointKey<T> = (endpoint: T) => unknown;

export interface PickerOptions<T> {
  /**
   * Identity of an endpoint across lists. Default: its string `id` when it
   * has one (discovery members are new objects in every committed
   * membership, so identity would lose the rotation), else the endpoint itself.
   */
  readonly key?: EndpointKey<T>;
  /** Index of the first pick (taken modulo the list's length); 0 by default. Clients may pass a random start to spread load. */
  readonly start?: number;
}

function idOrSelf(endpoint: unknown): unknown {
  const id = typeof endpoint === "object" && endpoint !== null ? (endpoint as { id?: unknown }).id : undefined;
  return typeof id === "string" ? id : endpoint;
}

/**
 * Round-robin over an immutable, ordered list of admitted endpoints, in the
 * pattern of grpc-js: the list never changes, and a change of membership
 * builds a new picker with `rebuild`, which carries the rotation over so
 * that the next pick continues after the endpoint picked last.
 */
export class RoundRobinPicker<T> {
  readonly endpoints: readonly T[];
  private readonly key: EndpointKey<T>;
  /** Index of the next pick. */
  private next: number;
  /** The key of the endpoint picked last, here or by a predecessor; carried over by rebuilds. */
  private last: { readonly key: unknown } | undefined;

  constructor(endpoints: readonly T[], options: PickerOptions<T> = {}) {
    this.endpoints = Object.freeze([...endpoints]);
    this.key = options.key ?? idOrSelf;
    const n = this.endpoints.length;
    const start = Math.trunc(options.start ?? 0);
    this.next = n === 0 ? 0 : ((start % n) + n) % n;
  }

  get size(): number {
    return this.endpoints.length;
  }

  /** The next endpoint in rotation; undefined when the list is empty. */
  pick(): T | undefined {
    const n = this.endpoints.length;
    if (n === 0) return undefined;
    const endpoint = this.endpoints[this.next]!;
    this.next = (this.next + 1) % n;
    this.last = { key: this.key(endpoint) };
    return endpoint;
  }

  /**
   * A new picker over `endpoints` that continues this one's rotation: after
   * the endpoint picked last if it is still listed; otherwise at the first
   * endpoint that would have come next here and is still listed; otherwise
   * at the start of the list. This picker is left as it is.
   */
  rebuild(endpoints: readonly T[]): RoundRobinPicker<T> {
    const successor = new RoundRobinPicker(endpoints, { key: this.key });
    successor.last = this.last;
    const n = this.endpoints.length;
    const m = successor.endpoints.length;
    if (m === 0) return successor;
    const index = new Map<unknown, number>();
    successor.endpoints.forEach((e, i) => {
      if (!index.has(this.key(e))) index.set(this.key(e), i);
    });
    const last = this.last === undefined ? undefined : index.get(this.last.key);
    if (last !== undefined) {
      successor.next = (last + 1) % m;
      return successor;
    }
    for (let step = 0; step < n; step++) {
      const at = index.get(this.key(this.endpoints[(this.next + step) % n]!));
      if (at !== undefined) {
        successor.next = at;
        break;
      }
    }
    return successor;
  }
}
