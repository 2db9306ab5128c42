import { KvHashError } from "./errors.js";

// The identity a relay pool advertises and a router resolves requests
// against. Names follow the reference's rule for identity text: non-empty and
// without leading or trailing whitespace (Unicode White_Space, as Rust's
// str::trim sees it). Nothing else is restricted and no length bound is
// imposed: the reference accepts any such name, and a stricter rule here
// would turn a pool it advertises into one we cannot resolve. Sizes are
// bounded where the text arrives (message size limits), not here.

declare const canonicalModelIdBrand: unique symbol;
declare const modelAliasBrand: unique symbol;

/** A canonical model or adapter name, validated by canonicalModelId. */
export type CanonicalModelId = string & { readonly [canonicalModelIdBrand]: true };
/** Another name a registration answers to, validated by modelAlias. */
export type ModelAlias = string & { readonly [modelAliasBrand]: true };

const SURROUNDING_WHITESPACE = /^\p{White_Space}|\p{White_Space}$/u;

function checkIdentityText(value: string, what: string): string {
  if (value === "") throw new KvHashError("EMPTY_NAME", `${what} must not be empty`);
  if (SURROUNDING_WHITESPACE.test(value)) {
    throw new KvHashError("SURROUNDING_WHITESPACE", `${what} ${JSON.stringify(value)} must not start or end with whitespace`);
  }
  return value;
}

/** `value` as a CanonicalModelId; KvHashError EMPTY_NAME or SURROUNDING_WHITESPACE otherwise. */
export function canonicalModelId(value: string): CanonicalModelId {
  return checkIdentityText(value, "canonical model id") as CanonicalModelId;
}

/** `value` as a ModelAlias; KvHashError EMPTY_NAME or SURROUNDING_WHITESPACE otherwise. */
export function modelAlias(value: string): ModelAlias {
  return checkIdentityText(value, "model alias") as ModelAlias;
}

/** What a registration serves: a base model, or a LoRA adapter on one. */
export type ModelTarget =
  | { readonly kind: "base"; readonly baseModel: CanonicalModelId }
  | { readonly kind: "lora"; readonly baseModel: CanonicalModelId; readonly adapter: CanonicalModelId };

export function baseTarget(baseModel: CanonicalModelId): ModelTarget {
  return Object.freeze({ kind: "base", baseModel });
}

export function loraTarget(baseModel: CanonicalModelId, adapter: CanonicalModelId): ModelTarget {
  return Object.freeze({ kind: "lora", baseModel, adapter });
}

/** The adapter of a LoRA target; undefined for a base model. */
export function targetAdapter(target: ModelTarget): CanonicalModelId | undefined {
  return target.kind === "lora" ? target.adapter : undefined;
}

/** One model name a pool serves, what it runs, and the other names it answers to. */
export interface CanonicalModelRegistration {
  readonly model: CanonicalModelId;
  readonly target: ModelTarget;
  /** Sorted by code point, without duplicates and without `model` itself. */
  readonly aliases: readonly ModelAlias[];
}

/**
 * Code-point order, which is the byte order of UTF-8 and so the order the
 * reference sorts names in. UTF-16 code-unit order differs only where a
 * surrogate (part of a code point past U+FFFF) meets U+E000..U+FFFF.
 */
function compareCodePoints(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    const xSurrogate = x >= 0xd800 && x <= 0xdfff;
    const ySurrogate = y >= 0xd800 && y <= 0xdfff;
    if (xSurrogate !== ySurrogate) return xSurrogate ? 1 : -1;
    return x - y;
  }
  return a.length - b.length;
}

/** A registration of `model` serving `target`. Aliases are normalized, not rejected: a self-alias or a repeat adds nothing. */
export function createRegistrationWithTarget(
  model: CanonicalModelId,
  target: ModelTarget,
  aliases: readonly ModelAlias[] = [],
): CanonicalModelRegistration {
  const sorted = aliases.filter((alias) => (alias as string) !== model).sort(compareCodePoints);
  const unique = sorted.filter((alias, i) => i === 0 || alias !== sorted[i - 1]);
  return Object.freeze({ model, target, aliases: Object.freeze(unique) });
}

/** A registration of the base model `model` under its own name. */
export function createRegistration(model: CanonicalModelId, aliases: readonly ModelAlias[] = []): CanonicalModelRegistration {
  return createRegistrationWithTarget(model, baseTarget(model), aliases);
}

/**
 * The registration a request for `requestedModel` is served by: the one whose
 * canonical name it is, else the first that lists it as an alias; undefined
 * when none does. Canonical names win so that another registration's alias
 * can never shadow a model's own name.
 */
export function resolveRegistration(
  registrations: readonly CanonicalModelRegistration[],
  requestedModel: string,
): CanonicalModelRegistration | undefined {
  return (
    registrations.find((registration) => registration.model === requestedModel) ??
    registrations.find((registration) => registration.aliases.some((alias) => alias === requestedModel))
  );
}
