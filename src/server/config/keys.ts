/**
 * Which keys a config may have: read from the zod schemas' definitions
 * (zod 4 keeps them on `_zod.def`; this is the one file that reads zod's
 * internals), for unknown-key hints, env names and list-valued keys.
 */
import type { ServiceModule } from "../module.js";
import { hostConfigSchema } from "./schema.js";

/** The keys a config may have with a set of modules. */
export interface ConfigKeyIndex {
  /** Every dotted key path of the schemas' objects, sections and leaves alike. */
  readonly paths: ReadonlySet<string>;
  /** Keys that hold a list of strings or numbers: env and flags may give those as `a,b` or a JSON array. */
  readonly lists: ReadonlyMap<string, "string" | "number">;
}

/** The parts of a zod schema's definition that say which keys it has (zod keeps them on `_zod.def`). */
interface SchemaDef {
  readonly type: string;
  readonly shape?: Record<string, unknown>;
  readonly innerType?: unknown;
  readonly in?: unknown;
  readonly out?: unknown;
  readonly element?: unknown;
  readonly options?: readonly unknown[];
  readonly left?: unknown;
  readonly right?: unknown;
  readonly getter?: () => unknown;
  readonly values?: readonly unknown[];
}

function schemaDef(schema: unknown): SchemaDef | undefined {
  return (schema as { _zod?: { def?: SchemaDef } } | undefined)?._zod?.def;
}

/** The definition behind wrappers (default, optional, pipes, lazy), where a value's shape is decided. */
function unwrapDef(schema: unknown, depth = 0): SchemaDef | undefined {
  const def = schemaDef(schema);
  if (def === undefined || depth > 32) return def;
  switch (def.type) {
    case "default":
    case "prefault":
    case "optional":
    case "nullable":
    case "readonly":
    case "catch":
    case "nonoptional":
      return unwrapDef(def.innerType, depth + 1);
    case "pipe":
      // z.preprocess pipes a transform into the schema, .transform() the schema into a transform.
      return unwrapDef(schemaDef(def.in)?.type === "transform" ? def.out : def.in, depth + 1);
    case "lazy":
      return unwrapDef(def.getter?.(), depth + 1);
    default:
      return def;
  }
}

function scalarKind(schema: unknown): "string" | "number" | undefined {
  const def = unwrapDef(schema);
  switch (def?.type) {
    case "string":
    case "enum":
    case "template_literal":
      return "string";
    case "number":
      return "number";
    case "literal":
      if (def.values?.every((v) => typeof v === "string")) return "string";
      return def.values?.every((v) => typeof v === "number") ? "number" : undefined;
    case "union": {
      const kinds = new Set(def.options?.map(scalarKind));
      return kinds.size === 1 ? [...kinds][0] : undefined;
    }
    default:
      return undefined;
  }
}

function indexSchema(schema: unknown, path: string, paths: Set<string>, lists: Map<string, "string" | "number">, depth = 0): void {
  const def = unwrapDef(schema);
  if (def === undefined || depth > 32) return;
  if (def.type === "object") {
    for (const [key, child] of Object.entries(def.shape ?? {})) {
      const at = path === "" ? key : `${path}.${key}`;
      paths.add(at);
      indexSchema(child, at, paths, lists, depth + 1);
    }
  } else if (def.type === "union") {
    for (const option of def.options ?? []) indexSchema(option, path, paths, lists, depth + 1);
  } else if (def.type === "intersection") {
    indexSchema(def.left, path, paths, lists, depth + 1);
    indexSchema(def.right, path, paths, lists, depth + 1);
  } else if (def.type === "array" && path !== "") {
    const kind = scalarKind(def.element);
    if (kind !== undefined) lists.set(path, kind);
  }
}

/** Every key the host's and these modules' schemas know, and which of them are lists. */
export function configKeyIndex(modules: readonly ServiceModule[]): ConfigKeyIndex {
  const paths = new Set<string>(["modules"]);
  const lists = new Map<string, "string" | "number">([["modules", "string"]]);
  indexSchema(hostConfigSchema, "", paths, lists);
  for (const module of modules) {
    paths.add(module.name);
    indexSchema(module.configSchema, module.name, paths, lists);
  }
  return { paths, lists };
}
