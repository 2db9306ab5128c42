/** Config error text: each problem names its field and the source (file, variable, flag) that set it. */
import type { z } from "zod";
import type { ConfigKeyIndex } from "./keys.js";
import { pathToEnvName } from "./sources.js";
import { nearestName } from "./suggest.js";

/** Whether an origin names an environment variable (else a flag or the config file). */
export function isEnvOrigin(origin: string): boolean {
  return /^[A-Z][A-Z0-9_]*$/.test(origin);
}

/**
 * The sources of the value at `path`: the one that set it or a key above
 * it (the latest, most specific), and for a section, those that set keys
 * inside it.
 */
export function originsOf(path: string, origins: ReadonlyMap<string, string>): string[] {
  let own: [string, string] | undefined;
  const inside: string[] = [];
  for (const [set, source] of origins) {
    if (path !== "" && (path === set || path.startsWith(`${set}.`))) {
      if (own === undefined || set.length >= own[0].length) own = [set, source];
    } else if (path === "" || set.startsWith(`${path}.`)) {
      inside.push(source);
    }
  }
  return [...new Set([...(own ? [own[1]] : []), ...inside])];
}

export function fromText(sources: readonly string[]): string {
  return sources.length > 0 ? ` (from ${sources.join(", ")})` : "";
}

/**
 * An unknown key, once per source that set it, under the path that source
 * used (`--set nope.key` reports `nope.key`), with the nearest known key
 * (as a variable name for a variable).
 */
function unknownKeyIssues(unknown: string, origins: ReadonlyMap<string, string>, index: ConfigKeyIndex): string[] {
  const bySource = new Map<string, string[]>();
  for (const [set, source] of origins) {
    const inside = set === unknown || set.startsWith(`${unknown}.`);
    if (!inside && !unknown.startsWith(`${set}.`)) continue;
    bySource.set(source, [...(bySource.get(source) ?? []), inside ? set : unknown]);
  }
  if (bySource.size === 0) bySource.set("", [unknown]);
  return [...bySource].map(([source, paths]) => {
    const shown = paths.length === 1 ? paths[0]! : unknown;
    const near = nearestName(shown, index.paths);
    const hint = near === undefined ? "" : `; did you mean ${isEnvOrigin(source) && source.startsWith("MMGATE_") ? pathToEnvName(near) : near}?`;
    return `${shown}: unknown key${hint}${fromText(source === "" ? [] : [source])}`;
  });
}

export function formatIssues(error: z.ZodError, prefix: string, origins: ReadonlyMap<string, string>, index: ConfigKeyIndex): string[] {
  return error.issues.flatMap((issue) => {
    const path = [prefix, ...issue.path.map(String)].filter((p) => p !== "").join(".");
    if (issue.code === "unrecognized_keys") {
      return issue.keys.flatMap((key) => unknownKeyIssues(path === "" ? key : `${path}.${key}`, origins, index));
    }
    // Name the variable, flag or file that set this field (or the section holding it).
    return [`${path || "(root)"}: ${issue.message}${fromText(originsOf(path, origins))}`];
  });
}
