/**
 * Edits of a keys file for `mmgate keys add|remove`: the file is read and
 * validated as the server reads it (a broken file is not edited), changed
 * (a YAML file keeps its comments and layout), and replaced atomically, so
 * that a server watching it reads the old file or the new one, never half
 * of one. Edits take turns: each holds `<file>.lock` (a directory, made
 * atomically; one left by a crashed edit is taken over after 10 s) from
 * reading the file to replacing it, so two at once cannot lose one's change.
 */
import { randomBytes } from "node:crypto";
import { chmod, open, readFile, rename, rm, stat } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { lock } from "proper-lockfile";
import { Document, isMap, isSeq, parseDocument } from "yaml";
import { KeysFileError } from "./errors.js";
import { isJsonFile, parseKeysDocument, validateKeys } from "./keys-file.js";
import type { KeyEntry } from "./schema.js";

/** What a new YAML keys file starts with. */
const YAML_HEADER = [
  " mmgate keys (auth.keysFile): each key's name, the SHA-256 of the key (never",
  " the key), scopes, and optionally expires (RFC 3339) and limits. Edit it with",
  " mmgate keys add|remove, or by hand; a running server reloads it on change.",
].join("\n");

/** Writes `data` to `file` through a temporary file in the same directory and a rename; an existing file's mode is kept (0600 for a new one). */
export async function writeFileAtomic(file: string, data: string): Promise<void> {
  const temp = join(dirname(file), `.${basename(file)}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`);
  const mode = await stat(file).then(
    (s) => s.mode & 0o777,
    () => undefined,
  );
  try {
    const handle = await open(temp, "wx", mode ?? 0o600);
    try {
      await handle.writeFile(data, "utf8");
      await handle.sync();
    } finally {
      await handle.close();
    }
    // open's mode goes through the umask; the old file's mode is kept as it was.
    if (mode !== undefined) await chmod(temp, mode);
    await rename(temp, file);
  } catch (err) {
    await rm(temp, { force: true });
    throw err;
  }
  // The rename itself outlives a crash once the directory is synced; where it cannot be, the file is still whole.
  await open(dirname(file), "r")
    .then(async (dir) => {
      await dir.sync().catch(() => undefined);
      await dir.close();
    })
    .catch(() => undefined);
}

/** A keys file's text, or undefined when there is none yet. */
async function readIfPresent(file: string): Promise<string | undefined> {
  try {
    return await readFile(file, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new KeysFileError("io", file, [`cannot read it (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`], { cause: err });
  }
}

/** An entry as the file writes it: fields in a fixed order, absent ones left out. */
function plainEntry(entry: KeyEntry): Record<string, unknown> {
  return {
    name: entry.name,
    sha256: entry.sha256,
    scopes: [...entry.scopes],
    ...(entry.expires !== undefined ? { expires: entry.expires } : {}),
    ...(entry.limits !== undefined ? { limits: { ...entry.limits } } : {}),
  };
}

/** A keys file opened for one edit: its keys, validated, and how to write it back with a change. */
interface Edit {
  readonly keys: readonly KeyEntry[];
  add(entry: KeyEntry): string;
  remove(index: number): string;
}

function openEdit(file: string, text: string | undefined): Edit {
  if (isJsonFile(file)) {
    const data = text === undefined ? { keys: [] } : (parseKeysDocument(text, file) as { keys: unknown[] });
    const keys = validateKeys(data, file);
    const write = () => `${JSON.stringify(data, null, 2)}\n`;
    return {
      keys,
      add: (entry) => (data.keys.push(plainEntry(entry)), write()),
      remove: (index) => (data.keys.splice(index, 1), write()),
    };
  }
  let doc: Document;
  if (text === undefined) {
    doc = new Document({ keys: [] });
    doc.commentBefore = YAML_HEADER;
  } else {
    parseKeysDocument(text, file);
    doc = parseDocument(text);
    if (doc.errors.length > 0) throw new KeysFileError("parse", file, [`not valid YAML: ${doc.errors[0]!.message.split("\n", 1)[0]}`]);
  }
  const keys = validateKeys(doc.toJS(), file);
  return {
    keys,
    add(entry) {
      const node = doc.createNode(plainEntry(entry));
      // Scopes on one line, as people write them.
      if (isMap(node)) {
        const scopes = node.get("scopes", true);
        if (isSeq(scopes)) scopes.flow = true;
      }
      doc.addIn(["keys"], node);
      const list = doc.get("keys", true);
      if (isSeq(list)) list.flow = false;
      return doc.toString();
    },
    remove(index) {
      doc.deleteIn(["keys", index]);
      return doc.toString();
    },
  };
}

/** How long an edit waits for another one's lock before it gives up ("locked"). */
export const EDIT_LOCK_WAIT_MS = 5000;
/** A lock not refreshed for this long is a crashed edit's, and is taken over. */
const EDIT_LOCK_STALE_MS = 10_000;

export interface EditOptions {
  /** How long to wait for another edit's lock; default EDIT_LOCK_WAIT_MS. */
  readonly lockWaitMs?: number;
}

/** Runs `edit` holding `file`'s edit lock. */
async function locked<T>(file: string, options: EditOptions, edit: () => Promise<T>): Promise<T> {
  const waitMs = options.lockWaitMs ?? EDIT_LOCK_WAIT_MS;
  let release: () => Promise<void>;
  try {
    release = await lock(file, {
      // The file may not exist yet (the first `keys add`).
      realpath: false,
      stale: EDIT_LOCK_STALE_MS,
      retries: { retries: Math.ceil(waitMs / 100), minTimeout: 100, maxTimeout: 100, factor: 1 },
    });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ELOCKED") throw new KeysFileError("locked", file, [`another edit holds ${file}.lock (waited ${waitMs / 1000} s); try again, or remove the lock if no edit runs`], { cause: err });
    throw new KeysFileError("io", file, [`cannot lock it for editing (${code ?? (err as Error).message})`], { cause: err });
  }
  try {
    return await edit();
  } finally {
    await release().catch(() => undefined);
  }
}

/** Adds a key to `file` (created when missing); "exists" when its name or digest is there already. */
export function addKey(file: string, entry: KeyEntry, options: EditOptions = {}): Promise<void> {
  return locked(file, options, () => addUnlocked(file, entry));
}

async function addUnlocked(file: string, entry: KeyEntry): Promise<void> {
  const edit = openEdit(file, await readIfPresent(file));
  const name = entry.name.toLowerCase();
  if (edit.keys.some((k) => k.name.toLowerCase() === name)) throw new KeysFileError("exists", file, [`a key named ${entry.name} is there already (mmgate keys remove ${entry.name} first, to replace it)`]);
  if (edit.keys.some((k) => k.sha256 === entry.sha256)) throw new KeysFileError("exists", file, ["a key with this digest is there already"]);
  const text = edit.add(entry);
  // What is written must read back as the server reads it.
  validateKeys(isJsonFile(file) ? JSON.parse(text) : parseDocument(text).toJS(), file);
  await writeFileAtomic(file, text);
}

/** Removes the key named `name` from `file`; returns it. "not_found" when there is none. */
export function removeKey(file: string, name: string, options: EditOptions = {}): Promise<KeyEntry> {
  return locked(file, options, () => removeUnlocked(file, name));
}

async function removeUnlocked(file: string, name: string): Promise<KeyEntry> {
  const text = await readIfPresent(file);
  if (text === undefined) throw new KeysFileError("io", file, ["cannot read it (ENOENT)"]);
  const edit = openEdit(file, text);
  const index = edit.keys.findIndex((k) => k.name.toLowerCase() === name.toLowerCase());
  if (index < 0) throw new KeysFileError("not_found", file, [`no key named ${name} (mmgate keys list shows the names)`]);
  await writeFileAtomic(file, edit.remove(index));
  return edit.keys[index]!;
}
