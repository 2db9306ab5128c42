/**
 * The keys file (`auth.keysFile`): named bearer keys, each stored as the
 * SHA-256 of the key, never the key itself, so the file can be read, copied
 * and mounted without handing out a credential. YAML, or JSON when its name
 * ends in `.json`.
 */
import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { extname } from "node:path";
import { parse as parseYaml } from "yaml";
import { KeysFileError } from "./errors.js";
import { keysFileSchema, type KeyEntry } from "./schema.js";

/** What `mmgate keys add` puts before a generated key, so that secret scanners and people recognise one. */
export const KEY_PREFIX = "mmk_";

/** A fresh key: 256 random bits, base64url, after KEY_PREFIX. */
export function generateKey(): string {
  return `${KEY_PREFIX}${randomBytes(32).toString("base64url")}`;
}

/** The hex SHA-256 of a key, as the keys file stores it. */
export function keyDigest(key: string): string {
  return createHash("sha256").update(key, "utf8").digest("hex");
}

/** Whether the file is read (and written) as JSON rather than YAML. */
export function isJsonFile(file: string): boolean {
  return extname(file).toLowerCase() === ".json";
}

/** `keys[1].scopes[0]`, from a zod issue's path. */
function issuePath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const part of path) out += typeof part === "number" ? `[${part}]` : `${out === "" ? "" : "."}${String(part)}`;
  return out === "" ? "(the file)" : out;
}

/** The document a keys file's text holds, unvalidated. */
export function parseKeysDocument(text: string, file: string): unknown {
  // A file caught while it is being written (truncated, then filled) must
  // not be read as "no keys": that would lock every caller out.
  if (text.trim() === "") throw new KeysFileError("empty", file, ["the file is empty"]);
  let raw: unknown;
  try {
    raw = isJsonFile(file) ? JSON.parse(text) : parseYaml(text);
  } catch (err) {
    throw new KeysFileError("parse", file, [`not valid ${isJsonFile(file) ? "JSON" : "YAML"}: ${(err as Error).message.split("\n", 1)[0]}`], { cause: err });
  }
  if (raw === null || raw === undefined) throw new KeysFileError("empty", file, ["the file holds no document (write keys: [] for no keys)"]);
  return raw;
}

/** Validates a keys file's document: every problem named by its path. */
export function validateKeys(raw: unknown, file: string): KeyEntry[] {
  const parsed = keysFileSchema.safeParse(raw);
  if (!parsed.success) throw new KeysFileError("invalid", file, parsed.error.issues.map((i) => `${issuePath(i.path)}: ${i.message}`));
  return parsed.data.keys;
}

/** The keys of a keys file's text; KeysFileError when it is empty, unreadable as YAML/JSON or invalid. */
export function parseKeysText(text: string, file: string): KeyEntry[] {
  return validateKeys(parseKeysDocument(text, file), file);
}

function readError(file: string, err: unknown): KeysFileError {
  const e = err as NodeJS.ErrnoException;
  return new KeysFileError("io", file, [`cannot read it (${e.code ?? e.message})`], { cause: err });
}

/** Reads and validates a keys file, at start-up. */
export function readKeysFileSync(file: string): { text: string; keys: KeyEntry[] } {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    throw readError(file, err);
  }
  return { text, keys: parseKeysText(text, file) };
}

/** Reads a keys file's text (validated apart, so that an unchanged file need not be). */
export async function readKeysText(file: string): Promise<string> {
  try {
    return await readFile(file, "utf8");
  } catch (err) {
    throw readError(file, err);
  }
}
