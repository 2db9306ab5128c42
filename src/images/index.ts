/**
 * Image generation with bounded multi-output fan-out, served as
 * mmgate.images.v1.ImageService.
 */
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import { bindService, defineModule } from "../server/index.js";
import { buildImageRuntime } from "./build.js";
import { imagesConfigSchema } from "./config.js";
import { imageService } from "./service.js";

export const imagesModule = defineModule({
  name: "images",
  description: "Image generation over registered providers with bounded multi-output fan-out",
  configSchema: imagesConfigSchema,
  create(ctx) {
    const runtime = buildImageRuntime(ctx.config);
    return {
      services: [bindService(ImageService, imageService(runtime, ctx.drainSignal))],
      close: () => runtime.shutdown(),
    };
  },
});

export { imagesConfigSchema, type ImagesConfig, type OpenAiProviderConfig } from "./config.js";
export { buildImageRuntime, type BuildOptions } from "./build.js";
export { ImageRuntime } from "./runtime/runtime.js";
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
