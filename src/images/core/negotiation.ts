import {
  cloneRequest,
  type GenerationParameters,
  type ImageRequest,
  type JsonValue,
  type Normalization,
  type ProviderCapabilities,
} from "../model.js";
import { ImageError } from "./errors.js";
import { parseSize } from "./validation.js";

export interface NegotiatedRequest {
  /** The parameters as sent. */
  readonly requested: GenerationParameters;
  readonly effectiveRequest: ImageRequest;
  readonly normalizations: Normalization[];
}

/** Sentence appended to the prompt when a negative prompt is merged. */
export const NEGATIVE_PROMPT_MERGE_PREFIX = "Avoid these elements:";

function unsupported(
  capabilities: ProviderCapabilities,
  field: string,
  message: string,
  extra: Record<string, JsonValue> = {},
): ImageError {
  const details: Record<string, JsonValue> = { field, ...extra };
  if (capabilities.model !== undefined) details["model"] = capabilities.model;
  return new ImageError("unsupported_capability", message, { provider: capabilities.provider, details });
}

function sizeSupported(size: string, capabilities: ProviderCapabilities): boolean {
  const sizes = capabilities.sizes;
  if (size === "auto") return sizes.auto;
  if (sizes.allowed.includes(size)) return true;
  if (!sizes.arbitrary) return false;
  const parsed = parseSize(size);
  if (!parsed) return false;
  const { width, height } = parsed;
  const short = Math.min(width, height);
  const long = Math.max(width, height);
  if (sizes.minEdge !== undefined && short < sizes.minEdge) return false;
  if (sizes.maxEdge !== undefined && long > sizes.maxEdge) return false;
  if (sizes.edgeMultiple !== undefined && (width % sizes.edgeMultiple !== 0 || height % sizes.edgeMultiple !== 0)) {
    return false;
  }
  if (sizes.minPixels !== undefined && width * height < sizes.minPixels) return false;
  if (sizes.maxPixels !== undefined && width * height > sizes.maxPixels) return false;
  if (sizes.maxAspectRatio !== undefined && long / short > sizes.maxAspectRatio) return false;
  return true;
}

function checkHardLimits(request: ImageRequest, capabilities: ProviderCapabilities): void {
  const model = request.routing.model;
  if (model !== undefined && capabilities.model !== undefined && model !== capabilities.model) {
    throw unsupported(capabilities, "routing.model", "the provider does not serve the requested model", {
      requested_model: model,
    });
  }
  const op = request.operation;
  if (op.kind === "generate" ? !capabilities.generation : !capabilities.edits) {
    throw unsupported(capabilities, "operation", `the provider does not support ${op.kind}`);
  }
  const refs = request.referenceImages.length;
  if (refs > 0 && (capabilities.referenceImages.support === "unsupported" || refs > capabilities.referenceImages.maxCount)) {
    throw unsupported(capabilities, "reference_images", "the provider cannot take these reference images");
  }
  if (op.kind === "edit") {
    const edits = capabilities.editImages;
    if (edits.support === "unsupported" || op.images.length > edits.maxCount) {
      throw unsupported(capabilities, "images", "the provider cannot take these edit images");
    }
    if (op.mask && capabilities.masks.support === "unsupported") {
      throw unsupported(capabilities, "mask", "the provider does not support masks");
    }
  }
  const mode = request.session.mode;
  if ((mode === "persistent" && !capabilities.persistentSessions) || (mode === "thread" && !capabilities.explicitThreads)) {
    throw unsupported(capabilities, "session.mode", `the provider does not support ${mode} sessions`);
  }
  if (request.user !== undefined && capabilities.userAttribution === "unsupported") {
    throw unsupported(capabilities, "user", "the provider cannot attribute requests to a user");
  }
  const fidelity = request.parameters.inputFidelity;
  if (fidelity !== undefined && !capabilities.inputFidelities.includes(fidelity)) {
    throw unsupported(capabilities, "parameters.input_fidelity", "the provider does not support this input fidelity", {
      requested: fidelity,
      supported: [...capabilities.inputFidelities],
    });
  }
}

/** The value to fall back to: the preferred one if supported, else the first. */
function preferred<T extends string>(preferredValue: T, supported: readonly T[]): T | undefined {
  return supported.includes(preferredValue) ? preferredValue : supported[0];
}

/**
 * Negotiates a valid request against a provider's capabilities, which must
 * have passed `validateCapabilities` (the fan-out decorator checks them
 * before and after its transform): hard mismatches are rejected in every
 * mode; the rest is rejected in strict mode and changed (and recorded)
 * otherwise.
 */
export function negotiateRequest(request: ImageRequest, capabilities: ProviderCapabilities): NegotiatedRequest {
  checkHardLimits(request, capabilities);

  const strict = request.policies.compatibility === "strict";
  const effective = cloneRequest(request);
  const p = effective.parameters;
  const normalizations: Normalization[] = [];
  const record = (field: string, requested: JsonValue | undefined, value: JsonValue | undefined, reason: string): void => {
    const entry: Normalization = { field, reason };
    if (requested !== undefined) entry.requested = requested;
    if (value !== undefined) entry.effective = value;
    normalizations.push(entry);
  };
  const reject = (field: string, message: string): never => {
    throw unsupported(capabilities, field, message);
  };

  // The action falls back to automatic in every mode when possible.
  if (!capabilities.actions.includes(p.action)) {
    if (!capabilities.actions.includes("auto")) reject("parameters.action", "the provider does not support this action");
    record("parameters.action", p.action, "auto", "provider_uses_automatic_action");
    p.action = "auto";
  }

  if (p.n < capabilities.count.min || p.n > capabilities.count.max) {
    if (strict) reject("parameters.n", `the provider accepts ${capabilities.count.min} to ${capabilities.count.max} outputs`);
    const clamped = Math.min(Math.max(p.n, capabilities.count.min), capabilities.count.max);
    record("parameters.n", p.n, clamped, "clamped_to_provider_range");
    p.n = clamped;
  }

  if (!sizeSupported(p.size, capabilities)) {
    if (strict) reject("parameters.size", "the provider does not support this size");
    const next = p.size !== "auto" && capabilities.sizes.auto ? "auto" : capabilities.sizes.allowed[0];
    if (next === undefined) reject("parameters.size", "the provider offers no usable size");
    record("parameters.size", p.size, next as string, "normalized_to_provider_size");
    p.size = next as string;
  }

  if (p.aspectRatio !== undefined && capabilities.aspectRatio === "unsupported") {
    if (strict) reject("parameters.aspect_ratio", "the provider does not support aspect ratio hints");
    record("parameters.aspect_ratio", p.aspectRatio, undefined, "provider_does_not_support_hint");
    delete p.aspectRatio;
  }
  if (p.resolution !== undefined && capabilities.resolution === "unsupported") {
    if (strict) reject("parameters.resolution", "the provider does not support resolution hints");
    record("parameters.resolution", p.resolution, undefined, "provider_does_not_support_hint");
    delete p.resolution;
  }

  const normalizeEnum = <K extends "quality" | "outputFormat" | "background" | "moderation">(
    key: K,
    field: string,
    preferredValue: GenerationParameters[K],
    supported: readonly GenerationParameters[K][],
  ): void => {
    const value = p[key];
    if (supported.includes(value)) return;
    if (strict) reject(field, `the provider does not support ${field.split(".")[1]} ${String(value)}`);
    const next = preferred(preferredValue, supported);
    if (next === undefined) reject(field, `the provider offers no ${field.split(".")[1]}`);
    record(field, value, next as JsonValue, "normalized_to_provider_value");
    p[key] = next as GenerationParameters[K];
  };
  normalizeEnum("quality", "parameters.quality", "auto", capabilities.qualities);
  normalizeEnum("outputFormat", "parameters.output_format", "png", capabilities.outputFormats);
  if (p.outputCompression !== undefined && p.outputFormat !== "jpeg" && p.outputFormat !== "webp") {
    record("parameters.output_compression", p.outputCompression, undefined, "effective_format_has_no_compression");
    delete p.outputCompression;
  }
  normalizeEnum("background", "parameters.background", "auto", capabilities.backgrounds);
  normalizeEnum("moderation", "parameters.moderation", "auto", capabilities.moderation);

  const partial = capabilities.partialImages;
  if (p.partialImages < partial.min || p.partialImages > partial.max) {
    if (strict) reject("parameters.partial_images", `the provider accepts ${partial.min} to ${partial.max} partial images`);
    const clamped = Math.min(Math.max(p.partialImages, partial.min), partial.max);
    record("parameters.partial_images", p.partialImages, clamped, "clamped_to_provider_range");
    p.partialImages = clamped;
  }

  if (effective.negativePrompt !== undefined) {
    const policy = request.policies.negativePrompt;
    const support = capabilities.negativePrompt;
    let merge: boolean;
    if (policy === "reject") reject("negative_prompt", "a negative prompt is not allowed by the policy");
    if (policy === "native") {
      if (support !== "native") reject("negative_prompt", "the provider has no native negative prompt");
      merge = false;
    } else if (policy === "merge") {
      merge = true;
    } else {
      if (support === "unsupported") reject("negative_prompt", "the provider does not support negative prompts");
      merge = support === "emulated";
    }
    if (merge) {
      effective.prompt = `${effective.prompt}\n\n${NEGATIVE_PROMPT_MERGE_PREFIX} ${effective.negativePrompt}`;
      delete effective.negativePrompt;
      record("negative_prompt", true, "merged_into_prompt", "negative_prompt_prompt_merge");
    }
  }

  if (request.policies.revisedPrompt === "require" && capabilities.revisedPrompt === "unsupported") {
    reject("policies.revised_prompt", "the provider does not report revised prompts");
  }

  return { requested: { ...request.parameters }, effectiveRequest: effective, normalizations };
}
