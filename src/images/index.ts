/**
 * Image generation with bounded multi-output fan-out, served as
 * mmgate.images.v1.ImageService.
 */
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import { bindService, defineModule, type ModuleContext, type ModuleInstance } from "../server/index.js";
import { buildImageRuntime, type BuildOptions } from "./build.js";
import { imagesConfigSchema, type ImagesConfig } from "./config.js";
import { ImageMetrics } from "./metrics.js";
import type { ImageRuntime } from "./runtime/runtime.js";
import { publishProviderHealth } from "./provider-health.js";
import { imageService } from "./service.js";

/**
 * Starts the capability: providers, runtime, metrics and the service
 * binding. `options` lets embedders and tests add providers in code.
 */
export function createImagesInstance(
  ctx: ModuleContext<ImagesConfig>,
  options: Omit<BuildOptions, "onOutcome"> = {},
): ModuleInstance & { runtime: ImageRuntime } {
  // The gauges read the runtime at scrape time; it exists by then.
  const holder: { runtime?: ImageRuntime; health?: ReturnType<typeof publishProviderHealth> } = {};
  const metrics = new ImageMetrics(ctx.metrics, () => holder.runtime);
  const runtime = buildImageRuntime(ctx.config, {
    ...options,
    onOutcome: (outcome) => {
      metrics.record(outcome);
      // After the runtime has recorded the outcome with the breaker.
      queueMicrotask(() => holder.health?.refresh());
    },
  });
  holder.runtime = runtime;
  const providerHealth = publishProviderHealth(runtime, ctx.health, ImageService.typeName);
  holder.health = providerHealth;
  return {
    runtime,
    services: [bindService(ImageService, imageService(runtime, ctx.drainSignal))],
    close: () => {
      providerHealth.stop();
      return runtime.shutdown();
    },
  };
}

export const imagesModule = defineModule({
  name: "images",
  description: "Image generation over registered providers with bounded multi-output fan-out",
  configSchema: imagesConfigSchema,
  create: (ctx) => createImagesInstance(ctx),
});

export { imagesConfigSchema, type ImagesConfig, type OpenAiProviderConfig } from "./config.js";
export { buildImageRuntime, type BuildOptions } from "./build.js";
export { ImageRuntime, type RuntimeOutcome } from "./runtime/runtime.js";
export { ImageMetrics } from "./metrics.js";
export { ProviderRegistry } from "./runtime/registry.js";
export { AdmissionGate } from "./runtime/admission.js";
export { CircuitBreaker, DEFAULT_CIRCUIT_BREAKER } from "./runtime/circuit-breaker.js";
export { OutputFanoutProvider, type OutputFanoutConfig } from "./fanout/provider.js";
export { ReferenceProvider } from "./providers/reference.js";
export { OpenAiImageProvider } from "./providers/openai.js";
export { ImageError, ERROR_CODES, type ErrorCode } from "./core/errors.js";
export { validateRequest, collectIssues, DEFAULT_REQUEST_LIMITS, type RequestLimits } from "./core/validation.js";
export { negotiateRequest } from "./core/negotiation.js";
export { validateCapabilities } from "./core/capabilities.js";
export type { ImageProvider, ProviderContext, ProviderEventSink } from "./core/provider.js";
export * from "./contract/types.js";
export { GRPC_STATUS, toConnectError, requestFromProto, responseToProto } from "./wire.js";
export { imagesCommand } from "./cli.js";
export { providerHealthName } from "./provider-health.js";
