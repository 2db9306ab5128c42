/**
 * `mmgate keys`: the keys file (auth.keysFile) by hand. `add` makes a key,
 * prints it once and writes only its digest; `list` shows names, scopes and
 * expiry; `remove` drops one; `hash` prints a key's digest. A running server
 * reloads the file on its own, so rotating a key is `add` (clients move to
 * the new key), then `remove` (of the old one), without a restart.
 */
import { Command, InvalidArgumentError, Option } from "commander";
import {
  addKey,
  callerNameSchema,
  ConfigError,
  configuredKeysFile,
  generateKey,
  keyDigest,
  KeysFileError,
  readKeysFileSync,
  removeKey,
  scopeCatalog,
  scopeSchema,
  type KeyEntry,
} from "../server/index.js";
import { CliError, EXIT, reportWarning, usageError, withExitCodes } from "../rpc/index.js";

/** Where the keys commands read and write; the process's streams by default. */
export interface KeysCliIo {
  readonly out: { write(text: string): unknown };
  readonly err: { write(text: string): unknown };
  /** All of standard input, for `keys hash`. */
  readonly stdin: () => Promise<string>;
  readonly env: Record<string, string | undefined>;
  readonly now: () => number;
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

const defaultIo: KeysCliIo = { out: process.stdout, err: process.stderr, stdin: readStdin, env: process.env, now: Date.now };

interface FileOptions {
  file?: string;
  config?: string;
}

/** --file, else the keys file of the config (--config / MMGATE_CONFIG) and the environment. */
function keysFileOf(o: FileOptions, io: KeysCliIo): string {
  if (o.file !== undefined) return o.file;
  let file: string;
  try {
    file = configuredKeysFile({ file: o.config, env: io.env });
  } catch (err) {
    if (err instanceof ConfigError) throw new CliError("config", err.message, { exitCode: EXIT.usage });
    throw err;
  }
  if (file === "") throw usageError("no keys file: give --file FILE, or --config FILE whose auth.keysFile is set (or MMGATE_AUTH__KEYS_FILE)");
  return file;
}

/** A keys file problem as the CLI reports it: io for reading and writing, not_found for a missing name, unavailable while another edit holds the file, invalid_argument otherwise. */
function fileError(err: unknown): unknown {
  if (!(err instanceof KeysFileError)) {
    const e = err as NodeJS.ErrnoException;
    return typeof e.code === "string" && /^E[A-Z]+$/.test(e.code) ? new CliError("io", `cannot write the keys file (${e.code}): ${e.message}`, { cause: err }) : err;
  }
  const code = err.code === "io" ? "io" : err.code === "not_found" ? "not_found" : err.code === "exists" ? "already_exists" : err.code === "locked" ? "unavailable" : "invalid_argument";
  const [first = "", ...rest] = err.problems;
  return new CliError(code, `${err.file}: ${first}`, { details: rest.map((p) => `  ${p}`), cause: err });
}

function withFileOptions(command: Command): Command {
  return command
    .addOption(new Option("--file <file>", "the keys file (default: auth.keysFile of --config)"))
    .addOption(new Option("-c, --config <file>", "the server's config file, whose auth.keysFile is the keys file").env("MMGATE_CONFIG"));
}

function collect(value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), ...value.split(",").map((s) => s.trim()).filter((s) => s !== "")];
}

function parseName(value: string): string {
  const parsed = callerNameSchema.safeParse(value);
  if (!parsed.success) throw new InvalidArgumentError(parsed.error.issues[0]?.message ?? "bad name");
  return value;
}

function positive(what: string, integer: boolean) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isFinite(n) || n <= 0 || (integer && !Number.isInteger(n))) throw new InvalidArgumentError(`${what} must be a positive ${integer ? "integer" : "number"}`);
    return n;
  };
}

const UNIT_MS: Readonly<Record<string, number>> = { m: 60_000, h: 3_600_000, d: 86_400_000 };

/** --expires: an RFC 3339 time with a zone, or a span from now (`90d`, `12h`, `30m`), as RFC 3339 UTC. */
function expiryOf(text: string, now: number): string {
  const span = /^(\d+)([mhd])$/.exec(text.trim());
  const at = span ? now + Number(span[1]) * UNIT_MS[span[2]!]! : /^\d{4}-\d{2}-\d{2}T.*(Z|[+-]\d{2}:\d{2})$/i.test(text) ? Date.parse(text) : Number.NaN;
  if (!Number.isFinite(at)) throw usageError(`--expires: expected an RFC 3339 time with a zone (2026-01-31T00:00:00Z) or a span from now (90d, 12h, 30m), got "${text}"`);
  if (at <= now) throw usageError(`--expires: ${text} is not in the future`);
  return span ? new Date(at).toISOString().replace(/\.\d{3}Z$/, "Z") : text;
}

interface AddOptions extends FileOptions {
  scope: string[];
  expires?: string;
  requestsPerSecond?: number;
  imagesPerMinute?: number;
  json?: boolean;
}

/** The scopes given, each one that names nothing refused with the nearest known scope. */
async function checkedScopes(scopes: readonly string[]): Promise<string[]> {
  for (const scope of scopes) {
    const parsed = scopeSchema.safeParse(scope);
    if (!parsed.success) throw usageError(`--scope ${scope}: ${parsed.error.issues[0]?.message ?? "bad scope"}`);
  }
  const catalog = await scopeCatalog();
  // Without the descriptor image only the syntax can be checked.
  if (catalog.size === 0) return [...new Set(scopes)];
  for (const scope of scopes) if (!catalog.has(scope)) throw usageError(`--scope: ${catalog.describeUnknown(scope)}`);
  return [...new Set(scopes)];
}

function expired(entry: KeyEntry, now: number): boolean {
  return entry.expires !== undefined && Date.parse(entry.expires) <= now;
}

function limitsText(entry: KeyEntry): string {
  const l = entry.limits;
  if (l === undefined) return "-";
  return [l.requestsPerSecond !== undefined ? `${l.requestsPerSecond}/s` : "", l.imagesPerMinute !== undefined ? `${l.imagesPerMinute} images/min` : ""].filter(Boolean).join(", ");
}

/** Rows as aligned columns. */
function table(rows: readonly (readonly string[])[]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows.map((r) => r.map((cell, i) => (i === r.length - 1 ? cell : cell.padEnd(widths[i]! + 2))).join("").trimEnd()).join("\n");
}

/** `mmgate keys add|list|remove|hash`. */
export function keysCommand(io: KeysCliIo = defaultIo): Command {
  const keys = new Command("keys").description("the keys file (auth.keysFile): add, list and remove named keys with scopes; a running server reloads it");

  withExitCodes(
    withFileOptions(
      keys
        .command("add")
        .description("make a key, print it once, and write only its SHA-256 with its name and scopes to the keys file (created when missing)")
        .argument("<name>", "the key's name: 1 to 64 letters, digits, '.', '_' or '-' (it is logged and labels metrics)", parseName),
    )
      .addOption(
        new Option("--scope <scope...>", "what the key may call: public, mutating, admin, a service (images), a method (images.generate); repeatable, or a,b")
          .argParser(collect)
          .makeOptionMandatory(),
      )
      .option("--expires <time>", "when the key stops working: RFC 3339 (2026-01-31T00:00:00Z) or a span from now (90d, 12h, 30m)")
      .option("--requests-per-second <n>", "the caller's image API request rate limit", positive("--requests-per-second", false))
      .option("--images-per-minute <n>", "the caller's image API images-per-minute limit", positive("--images-per-minute", true))
      .option("--json", "print one JSON object: name, key, sha256, scopes, expires, file"),
    { [EXIT.failure]: "the file could not be read or written, is invalid, or already has a key of that name" },
  ).action(async (name: string, o: AddOptions) => {
    const file = keysFileOf(o, io);
    const scopes = await checkedScopes(o.scope);
    const expires = o.expires === undefined ? undefined : expiryOf(o.expires, io.now());
    const key = generateKey();
    const limits = {
      ...(o.requestsPerSecond !== undefined ? { requestsPerSecond: o.requestsPerSecond } : {}),
      ...(o.imagesPerMinute !== undefined ? { imagesPerMinute: o.imagesPerMinute } : {}),
    };
    const entry: KeyEntry = {
      name,
      sha256: keyDigest(key),
      scopes,
      ...(expires !== undefined ? { expires } : {}),
      ...(Object.keys(limits).length > 0 ? { limits } : {}),
    };
    try {
      await addKey(file, entry);
    } catch (err) {
      throw fileError(err);
    }
    if (o.json) {
      io.out.write(`${JSON.stringify({ name, key, sha256: entry.sha256, scopes, ...(expires !== undefined ? { expires } : {}), file })}\n`);
    } else {
      io.out.write(`${key}\n`);
      io.err.write(`mmgate keys add: added ${name} (${scopes.join(", ")}${expires !== undefined ? `, expires ${expires}` : ""}) to ${file}; the key above is shown only now\n`);
    }
  });

  withExitCodes(
    withFileOptions(keys.command("list").description("the keys of the keys file: names, scopes, expiry and limits (digests with --digests; never the keys)"))
      .option("--digests", "show each key's SHA-256")
      .option("--json", "print one JSON object: the file and its keys"),
    { [EXIT.failure]: "the file could not be read or is invalid" },
  ).action((o: FileOptions & { digests?: boolean; json?: boolean }) => {
    const file = keysFileOf(o, io);
    let entries: KeyEntry[];
    try {
      entries = readKeysFileSync(file).keys;
    } catch (err) {
      throw fileError(err);
    }
    const now = io.now();
    if (o.json) {
      const keysJson = entries.map((e) => ({
        name: e.name,
        scopes: e.scopes,
        ...(e.expires !== undefined ? { expires: e.expires, expired: expired(e, now) } : {}),
        ...(e.limits !== undefined ? { limits: e.limits } : {}),
        ...(o.digests ? { sha256: e.sha256 } : {}),
      }));
      io.out.write(`${JSON.stringify({ file, keys: keysJson })}\n`);
      return;
    }
    if (entries.length === 0) {
      io.out.write(`no keys in ${file}\n`);
      return;
    }
    const header = ["NAME", "SCOPES", "EXPIRES", "LIMITS", ...(o.digests ? ["SHA256"] : [])];
    const rows = entries.map((e) => [
      e.name,
      e.scopes.join(","),
      e.expires === undefined ? "never" : `${e.expires}${expired(e, now) ? " (expired)" : ""}`,
      limitsText(e),
      ...(o.digests ? [e.sha256] : []),
    ]);
    io.out.write(`${table([header, ...rows])}\n`);
  });

  withExitCodes(
    withFileOptions(keys.command("remove").description("remove the key of that name from the keys file: a running server refuses it from its next reload").argument("<name>", "the key's name")),
    { [EXIT.failure]: "no key of that name, or the file could not be read, written, or is invalid" },
  ).action(async (name: string, o: FileOptions) => {
    const file = keysFileOf(o, io);
    try {
      await removeKey(file, name);
    } catch (err) {
      throw fileError(err);
    }
    io.err.write(`mmgate keys remove: removed ${name} from ${file}\n`);
  });

  withExitCodes(keys.command("hash").description("read a key from standard input and print its SHA-256, as the keys file stores it (for a key made elsewhere)"), {
    [EXIT.failure]: "no key on standard input, or one with white space inside",
  }).action(async () => {
    // One trailing line end is the shell's, not the key's.
    const key = (await io.stdin()).replace(/\r?\n$/, "");
    if (key === "") throw new CliError("invalid_argument", "no key on standard input (echo -n KEY | mmgate keys hash)");
    if (/\s/.test(key)) throw new CliError("invalid_argument", "a key cannot contain white space: a bearer header could not carry it");
    if (key.length < 16) reportWarning(io.err, "keys hash", "a key under 16 characters is easy to guess; mmgate keys add makes 256-bit ones");
    io.out.write(`${keyDigest(key)}\n`);
  });

  return keys;
}
