import type {
  ImageRequest,
  ImageResponse,
  ProviderCapabilities,
  ProviderDescriptor,
  ProviderEvent,
  SessionMetadata,
} from "../contract/types.js";
import { ImageError } from "./errors.js";

/**
 * Receives streaming events. Awaiting the returned promise is the
 * backpressure: a provider should not run ahead of a slow consumer.
 */
export type ProviderEventSink = (event: ProviderEvent) => Promise<void>;

/** What a provider gets with each operation. */
export interface ProviderContext {
  /** Unique per upstream operation; fan-out derives one per chunk. */
  readonly requestId: string;
  /** Absolute deadline in epoch milliseconds (Date.now() scale). */
  readonly deadline: number;
  /** Fires on caller cancellation, deadline or shutdown. */
  readonly signal: AbortSignal;
  /** Present when the caller streams; absent for unary calls. */
  readonly events?: ProviderEventSink;
}

/** An image backend. Implementations must honour `context.signal`. */
export interface ImageProvider {
  descriptor(): ProviderDescriptor;
  /** Capabilities for a model, or for the provider's default model. */
  capabilities(model?: string): Promise<ProviderCapabilities>;
  execute(request: ImageRequest, context: ProviderContext): Promise<ImageResponse>;
  /** Resolves when the provider can take work; throws an ImageError otherwise. */
  checkReady(): Promise<void>;
  getSession(key: string): Promise<SessionMetadata>;
  deleteSession(key: string): Promise<void>;
  /** Restarts of a supervised backend process, when there is one. */
  restartCount(): number | undefined;
  shutdown(): Promise<void>;
}

export function sessionsUnsupported(provider: string): ImageError {
  return new ImageError("unsupported_capability", "the provider does not keep sessions", {
    provider,
    details: { field: "session.mode" },
  });
}

/** Rejects with `cancelled` once the signal fires; resolves after `ms` otherwise. */
export function abortableDelay(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(new ImageError("cancelled", "the operation was cancelled"));
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(new ImageError("cancelled", "the operation was cancelled"));
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
