import { getRandomValues } from "node:crypto";
import { LRUCache } from "lru-cache";
import { MediaError } from "./errors.js";
import type { MediaTensorInfo } from "./tensor.js";

export interface StoredTensor {
  readonly handle: bigint;
  readonly data: Uint8Array;
  readonly tensorInfo: MediaTensorInfo;
  readonly contentHash: bigint | null;
}

export interface TensorStoreOptions {
  /** Byte budget over all held tensors; least recently used go first. */
  readonly maxBytes: number;
  /** Lifetime of an unreleased tensor, from when it was stored. */
  readonly ttlMs: number;
  /** Clock for TTLs (tests pass a manual one). */
  readonly clock?: { now(): number };
  /** Called whenever a tensor leaves the store, with the reason. */
  readonly onEvict?: (tensor: StoredTensor, reason: "released" | "expired" | "evicted") => void;
}

/** Handles stay below 2^53 so they survive any JSON parser exactly. */
function randomHandle(): bigint {
  const words = getRandomValues(new Uint32Array(2));
  return (BigInt(words[0]! & 0x1f_ffff) << 32n) | BigInt(words[1]!);
}

/**
 * Decoded tensors waiting for their receiver, under unguessable handles.
 * Bounded by bytes (LRU eviction) and by age (TTL). A tensor larger than
 * the whole budget is refused rather than evicting everything.
 */
export class TensorStore {
  private readonly cache: LRUCache<bigint, StoredTensor>;
  private readonly maxBytes: number;

  constructor(options: TensorStoreOptions) {
    this.maxBytes = options.maxBytes;
    this.cache = new LRUCache<bigint, StoredTensor>({
      maxSize: options.maxBytes,
      sizeCalculation: (t) => Math.max(1, t.data.length),
      ttl: options.ttlMs,
      ttlAutopurge: true,
      updateAgeOnGet: false,
      ...(options.clock ? { perf: options.clock, ttlResolution: 0 } : {}),
      dispose: (tensor, _key, reason) => {
        const why = reason === "delete" ? "released" : reason === "expire" ? "expired" : "evicted";
        options.onEvict?.(tensor, why);
      },
    });
  }

  /** Stores a tensor and returns its handle. */
  put(data: Uint8Array, tensorInfo: MediaTensorInfo, contentHash: bigint | null): bigint {
    if (data.length > this.maxBytes) {
      throw new MediaError(
        "TENSOR_TOO_LARGE_FOR_STORE",
        `Decoded tensor of ${data.length} bytes exceeds the tensor store budget of ${this.maxBytes} bytes`,
        BigInt(this.maxBytes),
        BigInt(data.length),
      );
    }
    let handle = randomHandle();
    while (handle === 0n || this.cache.has(handle)) handle = randomHandle();
    this.cache.set(handle, { handle, data, tensorInfo, contentHash });
    return handle;
  }

  /** The tensor under a handle, or undefined when unknown or expired. */
  get(handle: bigint): StoredTensor | undefined {
    return this.cache.get(handle);
  }

  /** Drops a tensor; false when the handle was unknown. */
  release(handle: bigint): boolean {
    return this.cache.delete(handle);
  }

  /** Bytes currently held. */
  get bytes(): number {
    return this.cache.calculatedSize;
  }

  get count(): number {
    return this.cache.size;
  }

  get budget(): number {
    return this.maxBytes;
  }

  clear(): void {
    this.cache.clear();
  }
}
