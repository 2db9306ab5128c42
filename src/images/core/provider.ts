import type { ImageRequest, ImageResponse, ProviderCapabilities, ProviderDescriptor, ProviderEvent } from "../model.js";

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

/**
 * An image backend. Implementations must honour `context.signal` and must
 * not change the request they are given.
 */
export interface ImageProvider {
  descriptor(): ProviderDescriptor;
  /** Capabilities for a model, or for the provider's default model. */
  capabilities(model?: string): Promise<ProviderCapabilities>;
  execute(request: ImageRequest, context: ProviderContext): Promise<ImageResponse>;
  /** Releases what the provider holds; called once when the runtime shuts down. */
  shutdown(): Promise<void>;
}
