import type { ProviderCapabilities } from "../model.js";
import { ImageError } from "./errors.js";

function invalid(capabilities: ProviderCapabilities, message: string): ImageError {
  return new ImageError("protocol", `provider capabilities are inconsistent: ${message}`, {
    provider: capabilities.provider,
    details: { provider: capabilities.provider },
  });
}

/**
 * Checks the internal consistency of advertised capabilities. Any violation
 * is a `protocol` error naming the provider.
 */
export function validateCapabilities(capabilities: ProviderCapabilities): void {
  const { count, batching, partialImages } = capabilities;
  if (count.min < 1 || count.min > count.max) throw invalid(capabilities, "count range");
  const native = batching.nativeCount;
  if (native.min < 1 || native.min > native.max) throw invalid(capabilities, "native count range");
  if (native.min < count.min || native.max > count.max) throw invalid(capabilities, "native count outside count");
  if (batching.maxParallelOutputs < 1 || batching.maxParallelOutputs > count.max) {
    throw invalid(capabilities, "max_parallel_outputs");
  }
  if (batching.mode === "native" && (native.min !== count.min || native.max !== count.max)) {
    throw invalid(capabilities, "native batching with a different native count");
  }
  if (batching.mode === "fan_out" && native.max >= count.max) {
    throw invalid(capabilities, "fan-out batching without a larger count");
  }
  if (partialImages.min > partialImages.max) throw invalid(capabilities, "partial image range");
  const hasTransparent = capabilities.backgrounds.includes("transparent");
  if (hasTransparent !== (capabilities.transparentBackground === "native")) {
    throw invalid(capabilities, "transparent background support");
  }
  if (capabilities.transparentBackground === "emulated") {
    const background = capabilities.backgrounds.includes("auto") || capabilities.backgrounds.includes("opaque");
    const format = capabilities.outputFormats.includes("png") || capabilities.outputFormats.includes("webp");
    if (!background || !format) throw invalid(capabilities, "emulated transparency");
  }
}
