/**
 * Image generation with bounded multi-output fan-out, served as
 * mmgate.images.v1.ImageService.
 */
export { defineImagesModule, imagesModule, type ImagesModuleOptions } from "./module.js";
export { imagesConfigSchema } from "./config.js";
export { OutputFanoutProvider } from "./fanout/provider.js";
export { DEFAULT_REQUEST_LIMITS } from "./core/validation.js";
export type { ImageProvider, ProviderContext } from "./core/provider.js";
export { createImageRequest, zeroTimings, type ImageRequest, type ImageResponse, type ProviderCapabilities } from "./model.js";
export { providerHealthName } from "./provider-health.js";
export { imagesCommand } from "./cli/index.js";
