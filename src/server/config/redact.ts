/** The config as print-config and GetConfig show it: secrets replaced, u64s as decimal strings. */
import type { MmgateConfig } from "./schema.js";

/** Secrets that print-config and GetConfig replace with "<redacted>". */
const SECRET_PATHS = [["auth", "token"]];
/** Keys that hold a secret wherever they sit inside a module's section (a pool's NATS credentials, say). */
const SECRET_KEYS = new Set(["token", "pass"]);

/**
 * Replaces every non-empty SECRET_KEYS value below `node`, in arrays too,
 * and writes u64s (bigint) as decimal strings, which the config reads back.
 */
function redactSecretKeys(node: unknown): void {
  if (typeof node !== "object" || node === null) return;
  const record = node as Record<string, unknown>;
  for (const [key, value] of Object.entries(record)) {
    if (SECRET_KEYS.has(key) && typeof value === "string" && value !== "") record[key] = "<redacted>";
    else if (typeof value === "bigint") record[key] = value.toString();
    else redactSecretKeys(value);
  }
}

/** The config as a plain object with secrets redacted, for printing and GetConfig. */
export function redactedConfig(config: MmgateConfig): Record<string, unknown> {
  const { sections, ...host } = config;
  const out = structuredClone({ ...host, ...sections }) as Record<string, unknown>;
  for (const name of Object.keys(sections)) redactSecretKeys(out[name]);
  // JSON-ready: print-config and GetConfig write it as it is.
  for (const path of SECRET_PATHS) {
    let node: unknown = out;
    for (const key of path.slice(0, -1)) node = (node as Record<string, unknown> | undefined)?.[key];
    const last = path[path.length - 1]!;
    if (node && typeof node === "object" && (node as Record<string, unknown>)[last]) {
      (node as Record<string, unknown>)[last] = "<redacted>";
    }
  }
  return out;
}
