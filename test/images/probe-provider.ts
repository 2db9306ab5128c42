import { ImageError } from "../../src/images/core/errors.js";
import type { ImageRequest, ImageResponse, ProviderCapabilities, ProviderDescriptor } from "../../src/images/model.js";
import type { ImageProvider, ProviderContext } from "../../src/images/core/provider.js";
import { delay } from "../../src/util/index.js";
import { fakeCapabilities } from "./fake-provider.js";

/** A slow provider that records whether the caller's cancellation reached it. */
export class ProbeProvider implements ImageProvider {
  started = 0;
  aborted = 0;
  private readonly waiters: (() => void)[] = [];

  constructor(
    readonly name = "probe",
    private readonly delayMs = 10_000,
  ) {}

  /** Resolves once `count` executions have started. */
  async whenStarted(count = 1): Promise<void> {
    while (this.started < count) await new Promise<void>((resolve) => this.waiters.push(resolve));
  }

  descriptor(): ProviderDescriptor {
    return { name: this.name, displayName: "Probe", version: "test", experimental: false, models: [] };
  }

  async capabilities(): Promise<ProviderCapabilities> {
    return { ...fakeCapabilities(), provider: this.name };
  }

  async execute(_request: ImageRequest, context: ProviderContext): Promise<ImageResponse> {
    this.started += 1;
    for (const wake of this.waiters.splice(0)) wake();
    try {
      await delay(this.delayMs, context.signal);
    } catch {
      this.aborted += 1;
      throw new ImageError("cancelled", "the operation was cancelled");
    }
    throw new Error("the probe never completes");
  }

  async shutdown(): Promise<void> {}
}
