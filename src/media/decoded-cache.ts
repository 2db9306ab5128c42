import { LRUCache } from "lru-cache";
import { isImageMetadata, type DecodedMedia } from "./tensor.js";

/** What a lookup or an insertion did, for the metrics. */
export type DecodedCacheEvent = "hit" | "miss" | "eviction";

export interface DecodedMediaCacheOptions {
  /** Byte budget over the cached tensors; 0 turns the cache off. */
  readonly maxBytes: number;
  /** Called for every hit, miss and eviction. */
  readonly onEvent?: (event: DecodedCacheEvent) => void;
}

/** Decode options that change the tensor, and so belong in the key. */
export interface DecodedCacheKeyOptions {
  readonly forceRgb: boolean;
  readonly applyExifOrientation: boolean;
}

/**
 * The cache key of an image fetched from `url` and decoded with `options`.
 * forceRgb changes the channel count (shape, bytes, hash) and
 * applyExifOrientation the shape and pixel order, so each combination is a
 * different tensor. The decoder limits and the URL policy are fixed for a
 * pipeline and stay out of the key. The URL is taken verbatim, as the
 * reference does: two spellings of one resource are two entries.
 */
export function decodedCacheKey(url: string, options: DecodedCacheKeyOptions): string {
  return `image:${options.forceRgb ? "rgb" : "src"}:${options.applyExifOrientation ? "exif" : "raw"}:${url}`;
}

/** One fetch and decode shared by every caller of a key. */
interface Flight {
  readonly controller: AbortController;
  readonly promise: Promise<DecodedMedia>;
  waiters: number;
}

function freezeDecoded(decoded: DecodedMedia): DecodedMedia {
  // Typed arrays with elements cannot be frozen; the bytes stay read-only by contract.
  const info = decoded.tensorInfo;
  Object.freeze(info.shape);
  if (info.metadata !== null) {
    for (const inner of Object.values(info.metadata) as object[]) Object.freeze(inner);
    Object.freeze(info.metadata);
  }
  Object.freeze(info);
  return Object.freeze(decoded);
}

/**
 * Decoded images by key (see decodedCacheKey), least recently used evicted
 * beyond `maxBytes` (cost: the tensor's byte length, the reference's
 * element count). An entry larger than the whole budget is counted as an
 * eviction and not kept, without flushing the others.
 *
 * Concurrent lookups of one key share one production (single flight): the
 * first starts it, later ones join it, all get its result. A caller's own
 * cancellation or deadline only ends its own wait; the shared work is
 * aborted when the last waiter leaves, and the next lookup starts afresh.
 * Failures are not cached: every waiter of a failed production gets its
 * error, and the next lookup tries again. Only image tensors are kept; any
 * other result (a video) is shared with the callers waiting for it, then
 * dropped.
 *
 * Returned objects are shared by every caller and must not be mutated:
 * the tensor info is frozen; the bytes cannot be, and are read-only by
 * contract (the tensor store and the RPCs only read them).
 */
export class DecodedMediaCache {
  private readonly entries: LRUCache<string, DecodedMedia> | null;
  private readonly flights = new Map<string, Flight>();
  readonly maxBytes: number;

  constructor(private readonly options: DecodedMediaCacheOptions) {
    if (!(Number.isSafeInteger(options.maxBytes) && options.maxBytes >= 0)) {
      throw new RangeError("decoded cache maxBytes must be a whole number >= 0");
    }
    this.maxBytes = options.maxBytes;
    this.entries =
      options.maxBytes === 0
        ? null
        : new LRUCache<string, DecodedMedia>({
            maxSize: options.maxBytes,
            sizeCalculation: (decoded) => Math.max(1, decoded.data.length),
            dispose: (_decoded, _key, reason) => {
              if (reason === "evict") options.onEvent?.("eviction");
            },
          });
  }

  /** False when maxBytes is 0: `get` then runs `produce` for every call. */
  get enabled(): boolean {
    return this.entries !== null;
  }

  /** Bytes of the cached tensors. */
  get bytes(): number {
    return this.entries?.calculatedSize ?? 0;
  }

  /** Cached tensors. */
  get count(): number {
    return this.entries?.size ?? 0;
  }

  /** Productions running now. */
  get inFlight(): number {
    return this.flights.size;
  }

  /** The cached tensor under `key`, without touching its recency or the counts. */
  peek(key: string): DecodedMedia | undefined {
    return this.entries?.peek(key);
  }

  /**
   * The tensor under `key`: from the cache, from a production in flight, or
   * from a new one (`produce`, given a signal that fires only when every
   * waiter has left). Rejects with `signal`'s reason when the caller leaves.
   */
  get(key: string, signal: AbortSignal, produce: (signal: AbortSignal) => Promise<DecodedMedia>): Promise<DecodedMedia> {
    if (signal.aborted) return Promise.reject(signal.reason as Error);
    if (this.entries === null) return (async () => produce(signal))();
    const cached = this.entries.get(key);
    if (cached !== undefined) {
      this.options.onEvent?.("hit");
      return Promise.resolve(cached);
    }
    let flight = this.flights.get(key);
    if (flight !== undefined) {
      this.options.onEvent?.("hit");
    } else {
      this.options.onEvent?.("miss");
      flight = this.start(key, produce);
    }
    return this.wait(key, flight, signal);
  }

  /** Drops every cached tensor (productions in flight are left alone). */
  clear(): void {
    this.entries?.clear();
  }

  private start(key: string, produce: (signal: AbortSignal) => Promise<DecodedMedia>): Flight {
    const controller = new AbortController();
    const settle = () => {
      if (this.flights.get(key) === flight) this.flights.delete(key);
    };
    const promise = (async () => produce(controller.signal))().then(
      (decoded) => {
        settle();
        const kept = freezeDecoded(decoded);
        this.insert(key, kept);
        return kept;
      },
      (error: unknown) => {
        settle();
        throw error;
      },
    );
    // Waiters see the failure; when every one has left, nobody does.
    promise.catch(() => undefined);
    const flight: Flight = { controller, promise, waiters: 0 };
    this.flights.set(key, flight);
    return flight;
  }

  private insert(key: string, decoded: DecodedMedia): void {
    const entries = this.entries!;
    // Images only, as the reference caches: a URL's modality is known only
    // once it is decoded, so a video still shares its flight with concurrent
    // callers but is not kept (one could hold the whole budget).
    if (!isImageMetadata(decoded.tensorInfo.metadata)) return;
    if (Math.max(1, decoded.data.length) > this.maxBytes) {
      // The reference inserts it and evicts it at once; the others stay.
      this.options.onEvent?.("eviction");
      return;
    }
    entries.set(key, decoded);
  }

  private wait(key: string, flight: Flight, signal: AbortSignal): Promise<DecodedMedia> {
    flight.waiters++;
    return new Promise<DecodedMedia>((resolve, reject) => {
      let left = false;
      // A waiter leaves once: by its own abort or by the shared result.
      const leave = (): boolean => {
        if (left) return false;
        left = true;
        flight.waiters--;
        signal.removeEventListener("abort", onAbort);
        return true;
      };
      const onAbort = () => {
        if (!leave()) return;
        if (flight.waiters === 0) {
          // The last waiter left: stop the shared work, and let the next
          // lookup start a production of its own.
          if (this.flights.get(key) === flight) this.flights.delete(key);
          flight.controller.abort(signal.reason);
        }
        reject(signal.reason as Error);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      flight.promise.then(
        (decoded) => {
          if (leave()) resolve(decoded);
        },
        (error: unknown) => {
          if (leave()) reject(error as Error);
        },
      );
    });
  }
}
