import type { ImagesConfig } from "./config.js";
import { breakerVerdictOf, ImageError } from "./core/errors.js";
import type { ImageProvider } from "./core/provider.js";
import type { RequestLimits } from "./core/validation.js";
import { OutputFanoutProvider } from "./fanout/provider.js";
import { OpenAiImageProvider } from "./providers/openai.js";
import { ReferenceProvider } from "./providers/reference.js";
import { AdmissionGate, type AdmissionLimits } from "./runtime/admission.js";
import { CircuitBreaker } from "./runtime/circuit-breaker.js";
import { ProviderRegistry, type RegisteredProvider } from "./runtime/registry.js";
import { ImageRuntime, type RuntimeOutcome } from "./runtime/runtime.js";

function admissionLimits(limits: { maxConcurrent: number | "unlimited"; maxQueued: number | "unlimited" }): AdmissionLimits {
  return {
    ...(limits.maxConcurrent === "unlimited" ? {} : { maxConcurrent: limits.maxConcurrent }),
    ...(limits.maxQueued === "unlimited" ? {} : { maxQueued: limits.maxQueued }),
  };
}

export interface BuildOptions {
  /** Environment for API key lookup; process.env by default. */
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** Replaces or adds providers (tests, embedding). */
  readonly extraProviders?: readonly ImageProvider[];
  readonly onOutcome?: (outcome: RuntimeOutcome) => void;
}

/** Builds the providers, their fan-out decorators, gates and breakers, and the runtime. */
export function buildImageRuntime(config: ImagesConfig, options: BuildOptions = {}): ImageRuntime {
  const limits: RequestLimits = { ...config.limits };
  const inner: ImageProvider[] = [];
  if (config.reference.enabled) inner.push(new ReferenceProvider(config.reference));
  for (const openai of config.openai) inner.push(new OpenAiImageProvider(openai, options.env ?? process.env));
  inner.push(...(options.extraProviders ?? []));

  const parallel = config.fanout.maxParallelOutputs === "auto" ? config.fanout.maxOutputs : config.fanout.maxParallelOutputs;
  const entries: RegisteredProvider[] = inner.map((provider) => {
    const name = provider.descriptor().name;
    return {
      name,
      provider: new OutputFanoutProvider(
        provider,
        {
          maxOutputs: config.fanout.maxOutputs,
          maxParallelOutputs: parallel,
          permitTimeoutMs: config.fanout.permitTimeoutMs,
          siblingGraceMs: config.fanout.siblingGraceMs,
        },
        limits,
      ),
      gate: new AdmissionGate(`provider:${name}`, admissionLimits(config.admission.perProvider)),
      breaker: new CircuitBreaker(name, config.circuitBreaker, breakerVerdictOf),
    };
  });
  if (entries.length === 0) throw new ImageError("configuration", "no image provider is enabled");
  const defaultProvider = config.defaultProvider !== "" ? config.defaultProvider : entries[0]!.name;
  const registry = new ProviderRegistry(entries, defaultProvider);
  return new ImageRuntime(registry, {
    limits,
    defaultTimeoutMs: config.defaultTimeoutMs,
    cancellationGraceMs: config.cancellationGraceMs,
    shutdownGraceMs: config.shutdownGraceMs,
    globalAdmission: admissionLimits(config.admission.global),
    ...(options.onOutcome ? { onOutcome: options.onOutcome } : {}),
  });
}
