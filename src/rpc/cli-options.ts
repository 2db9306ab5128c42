import { Code, ConnectError, type Transport } from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import { CommanderError, InvalidArgumentError, Option, type Command } from "commander";
import { hostPort } from "../server/index.js";
import { MAX_TIMER_MS } from "../util/index.js";
import { createChannel } from "./channel.js";
import { ChannelConfigError, MAX_MESSAGE_LIMIT_BYTES, channelDefaults } from "./config.js";

export const DEFAULT_ADDR = "127.0.0.1:50051";

/** Validates HOST:PORT or [IPv6]:PORT for --addr, by the rule the config's listen addresses follow. */
export function parseAddr(value: string): string {
  const parsed = hostPort.safeParse(value);
  if (!parsed.success) throw new InvalidArgumentError(parsed.error.issues[0]?.message ?? "expected HOST:PORT");
  return value;
}

/** The `--addr HOST:PORT` option every client subcommand takes (MMGATE_ADDR as the default). */
export function addrOption(): Option {
  return new Option("--addr <host:port>", "server address").default(DEFAULT_ADDR).env("MMGATE_ADDR").argParser(parseAddr);
}

/** `--token` for methods that need the bearer token; MMGATE_AUTH_TOKEN is the default. */
export function tokenOption(): Option {
  return new Option("--token <token>", "bearer token for mutating and admin methods: the server's auth.token, or a key of its auth.keysFile").env("MMGATE_AUTH_TOKEN");
}

const UNIT_MS: Readonly<Record<string, number>> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/**
 * A deadline as --timeout takes it: milliseconds (`5000`), or a number with
 * a unit (`500ms`, `1.5s`, `2m`, `1h`); `0` or `none` for no deadline.
 * Returns whole milliseconds, 0 meaning none.
 */
export function parseTimeout(text: string): number {
  const value = text.trim().toLowerCase();
  if (value === "none") return 0;
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(value);
  // Rounded up: a tiny deadline must not become 0, which means none.
  const ms = match ? Math.ceil(Number(match[1]) * UNIT_MS[match[2] ?? "ms"]!) : Number.NaN;
  if (!Number.isFinite(ms) || ms > MAX_TIMER_MS) {
    throw new InvalidArgumentError(`expected milliseconds (5000) or a duration (500ms, 30s, 5m, 1h) up to ${MAX_TIMER_MS} ms; 0 or none for no deadline`);
  }
  return ms;
}

/**
 * `--timeout`, the deadline of each call a client command makes. No
 * deadline by default: image generation and long replays take minutes, and
 * a watch runs until it is stopped; probes pass their own (`--timeout 5s`).
 */
export function timeoutOption(
  description = "deadline of each call: milliseconds or a duration (500ms, 30s, 5m); 0 for none",
  defaultMs = 0,
): Option {
  return new Option("--timeout <ms|duration>", description).default(defaultMs, defaultMs === 0 ? "none" : `${defaultMs / 1000}s`).argParser(parseTimeout);
}

/** What a client subcommand needs to reach a server. */
export interface ConnectionOptions {
  addr: string;
  /** Connect with TLS (implied by --ca). */
  tls?: boolean;
  /** PEM file of the CA that signed the server's certificate; the system CAs otherwise. */
  ca?: string;
  /** PEM client certificate and its key, for servers with tls.clientAuth (mutual TLS); both or neither. */
  cert?: string;
  key?: string;
  /** Deadline of each call in ms (--timeout); 0 or absent: none. */
  timeout?: number;
}

export function tlsOption(): Option {
  return new Option("--tls", "connect with TLS (the server has tls.certFile set)");
}

export function caOption(): Option {
  return new Option("--ca <file>", "PEM CA certificate to trust for --tls (implies --tls)");
}

/** `--cert` and `--key`: the client certificate a server with tls.clientAuth asks for. */
export function clientCertificateOptions(): Option[] {
  return [
    new Option("--cert <file>", "PEM client certificate to present, for a server with tls.clientAuth (implies --tls; with --key)"),
    new Option("--key <file>", "PEM private key of --cert"),
  ];
}

/** Adds --addr, --tls, --ca, --cert, --key and --timeout to a client subcommand. */
export function withConnectionOptions(command: Command, options: { defaultTimeoutMs?: number } = {}): Command {
  command.addOption(addrOption()).addOption(tlsOption()).addOption(caOption());
  for (const option of clientCertificateOptions()) command.addOption(option);
  return command.addOption(timeoutOption(undefined, options.defaultTimeoutMs));
}

/**
 * The default deadline of the commands that ask a server how it is (health,
 * status): a probe must not hang on a stuck server. Commands that do work
 * (generate, publish, watch) have none by default.
 */
export const STATUS_TIMEOUT_MS = 5000;

/**
 * A channel to the server the options name: h2c, or TLS with --tls / --ca;
 * every call on it gets the --timeout deadline. Message sizes are bounded
 * only by what a server can be configured to send. An unreadable --ca file
 * is an `io` error naming the flag.
 */
export function clientTransport(options: ConnectionOptions): Transport {
  if ((options.cert === undefined) !== (options.key === undefined)) {
    throw usageError(options.cert === undefined ? "--key needs --cert" : "--cert needs --key", ["pass the client certificate and its private key together: --cert FILE --key FILE"]);
  }
  try {
    return createChannel(options.addr, {
      ...channelDefaults,
      tls: options.tls === true || options.ca !== undefined || options.cert !== undefined,
      caFile: options.ca ?? "",
      certFile: options.cert ?? "",
      keyFile: options.key ?? "",
      maxReceiveMessageBytes: MAX_MESSAGE_LIMIT_BYTES,
      maxSendMessageBytes: MAX_MESSAGE_LIMIT_BYTES,
      defaultTimeoutMs: options.timeout ?? 0,
    });
  } catch (err) {
    if (err instanceof ChannelConfigError) {
      const flag = ({ caFile: "--ca", certFile: "--cert", keyFile: "--key" } as Record<string, string>)[err.field];
      if (flag !== undefined) throw ioError(`${flag}: ${err.detail}`, err);
    }
    throw err;
  }
}

/*
 * How every mmgate command reports a failure: one line
 * `mmgate <command>: [code] message` on stderr, then any detail and
 * `hint:` lines, and an exit code from one table. The code is the
 * gRPC/Connect code name of a failed call (`unavailable`,
 * `invalid_argument`, …) or a local one: `usage` (the command line is
 * wrong), `config` (the configuration is invalid), `io` (a file could not
 * be read or written). Scripts can match on the bracket; people read the
 * rest.
 */

/** The exit codes every command shares. */
export const EXIT = Object.freeze({
  /** Done. */
  ok: 0,
  /** The call failed, the input was bad, or a file could not be read or written. */
  failure: 1,
  /** The command line is wrong (or, for `serve`, the configuration); nothing was sent. */
  usage: 2,
  /** The call succeeded but some of its items did not (some images failed, some events were rejected, an unknown handle). */
  partial: 3,
});

/** The `Exit codes:` epilogue of a command's help; `specific` replaces or adds lines for that command. */
export function exitCodesHelp(specific: Readonly<Record<number, string>> = {}): string {
  const lines: Record<number, string> = {
    [EXIT.ok]: "done",
    [EXIT.failure]: "failed: the call failed (server unreachable, deadline, refused), bad input, or a file could not be read or written",
    [EXIT.usage]: "usage: unknown command or option, a missing or bad option value; nothing was sent",
    ...specific,
  };
  const codes = Object.keys(lines)
    .map(Number)
    .sort((a, b) => a - b);
  return `\nExit codes:\n${codes.map((code) => `  ${String(code).padEnd(4)}${wrap(lines[code]!, 74).join(`\n${" ".repeat(6)}`)}`).join("\n")}\n`;
}

/** `text` broken at spaces into lines of at most `width` columns, as commander wraps its own help. */
function wrap(text: string, width: number): string[] {
  const lines: string[] = [];
  let line = "";
  for (const word of text.split(" ")) {
    if (line !== "" && line.length + 1 + word.length > width) {
      lines.push(line);
      line = word;
    } else {
      line = line === "" ? word : `${line} ${word}`;
    }
  }
  return [...lines, line];
}

/** Commands whose help already lists their exit codes. */
const documented = new WeakSet<Command>();

/** Adds the exit codes, with `specific` ones for this command, to its help. */
export function withExitCodes<C extends Command>(command: C, specific: Readonly<Record<number, string>> = {}): C {
  documented.add(command);
  command.addHelpText("after", exitCodesHelp(specific));
  return command;
}

/** Whether withExitCodes documented this command. */
export function hasExitCodesHelp(command: Command): boolean {
  return documented.has(command);
}

/** A failure a command diagnosed itself, with the code its line shows. */
export class CliError extends Error {
  override readonly name = "CliError";
  readonly exitCode: number;
  /** Lines printed as they are after the error line (e.g. `details: {…}`). */
  readonly details: readonly string[];
  /** Printed as `hint: …` lines. */
  readonly hints: readonly string[];

  constructor(
    /** `usage`, `config`, `io`, or a gRPC code name in snake case. */
    readonly code: string,
    message: string,
    options: { exitCode?: number; details?: readonly string[]; hints?: readonly string[]; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.exitCode = options.exitCode ?? (code === "usage" ? EXIT.usage : EXIT.failure);
    this.details = options.details ?? [];
    this.hints = options.hints ?? [];
  }
}

/** The command line is wrong: exit 2, found before anything was sent. */
export function usageError(message: string, hints: readonly string[] = []): CliError {
  return new CliError("usage", message, { hints });
}

/** A file could not be read or written. */
export function ioError(message: string, cause?: unknown): CliError {
  return new CliError("io", message, { cause });
}

/** The snake-case name of a gRPC/Connect code, as connect prints it (`invalid_argument`). */
export function snakeCodeName(code: Code): string {
  return codeToString(code);
}

/** Where and how a client command connected: lets a failed call's report say whether --tls or --timeout was the problem. */
export interface ConnectionContext {
  readonly addr?: string;
  readonly tls?: boolean;
  /** The --timeout in ms (0: none). */
  readonly timeout?: number;
}

/** A failure as it is printed. */
export interface Described {
  readonly code: string;
  readonly message: string;
  readonly details: readonly string[];
  readonly hints: readonly string[];
  readonly exitCode: number;
}

/** Every message and error code along an error's cause chain, for recognising transport failures. */
function causeText(err: unknown): string {
  const parts: string[] = [];
  let at: unknown = err;
  for (let depth = 0; at instanceof Error && depth < 8; depth++) {
    parts.push(at.message);
    const code = (at as NodeJS.ErrnoException).code;
    if (typeof code === "string") parts.push(code);
    at = at.cause;
  }
  return parts.join(" ");
}

/** OpenSSL's `…:error:0A00010B:SSL routines:ssl3_get_record:wrong version number:file:line:` → its reason. */
function opensslReason(text: string): string | undefined {
  return /SSL routines:[^:]*:([^:]+):/.exec(text)?.[1];
}

/** A transport error's text for a person: trimmed, OpenSSL's error string cut to its reason. */
export function plainMessage(text: string): string {
  const reason = opensslReason(text);
  return reason === undefined ? text.trim() : text.replace(/[0-9A-F]+:error:[0-9A-F]+:SSL routines:[^\n]*/, `TLS: ${reason}`).trim();
}

/**
 * A plaintext (h2c) client talking to a TLS port: the server drops the
 * connection before any HTTP/2 answer (connect reports the stream as
 * CANCEL), or answers bytes that are no HTTP/2 (protocol errors, resets).
 */
const CLOSED_BEFORE_ANSWER = /stream closed with error code CANCEL \(0x8\)/;
const NOT_HTTP2 = /Protocol error|PROTOCOL_ERROR|ERR_HTTP2_(?:ERROR|SESSION_ERROR|STREAM_ERROR|INVALID_SESSION)|ECONNRESET|socket hang up|HTTP\/0\.9|premature close/i;
/** A TLS client talking to a plaintext port. */
const NOT_TLS = /wrong version number|ERR_SSL_WRONG_VERSION_NUMBER|packet length too long|unknown protocol|ERR_SSL_HTTP_REQUEST|EPROTO/i;
/** A TLS server whose certificate the client does not trust. */
const UNTRUSTED = /self[- ]signed certificate|unable to verify the first certificate|unable to get local issuer certificate|ERR_TLS_CERT_ALTNAME_INVALID|certificate has expired|CERT_UNTRUSTED|UNABLE_TO_VERIFY_LEAF_SIGNATURE/i;

/** How a transport failure reads when the client's idea of TLS does not match the server's. */
interface Mismatch {
  /** The code to show: UNAVAILABLE, as gRPC's own clients report a connection that never carried the call. */
  readonly code: string;
  /** The message in words, or undefined to keep the original. */
  readonly message?: string;
  readonly hint: string;
}

/**
 * Recognises, from an error's text, the failures a client meets when it
 * speaks h2c to a TLS port, TLS to a cleartext port, or TLS to a server
 * whose certificate it does not trust.
 */
export function tlsMismatch(text: string, context: ConnectionContext): Mismatch | undefined {
  const at = context.addr !== undefined ? ` at ${context.addr}` : "";
  const unavailable = snakeCodeName(Code.Unavailable);
  if (context.tls === false) {
    const hint = `if the server${at} serves TLS (tls.certFile set), add --tls (and --ca FILE when a private CA signed its certificate)`;
    // The CLI cancels no call itself: a CANCEL before any answer is the server closing the connection.
    if (CLOSED_BEFORE_ANSWER.test(text)) return { code: unavailable, message: `the server${at} closed the connection before answering`, hint };
    if (NOT_HTTP2.test(text)) return { code: unavailable, hint };
  }
  if (context.tls === true) {
    if (NOT_TLS.test(text)) {
      const reason = opensslReason(text) ?? "the answer is no TLS";
      return { code: unavailable, message: `TLS handshake with the server${at} failed: ${reason}`, hint: `the server${at} does not seem to serve TLS: leave out --tls and --ca` };
    }
    if (UNTRUSTED.test(text)) return { code: unavailable, hint: "the server's certificate is not trusted: pass the PEM certificate of the CA that signed it with --ca FILE" };
  }
  return undefined;
}

/** A failed call; a TLS mismatch is said in words, with a hint at --tls / --ca. */
function describeCall(e: ConnectError, context: ConnectionContext): Described {
  const raw = plainMessage(e.rawMessage);
  const mismatch = e.code === Code.Canceled || e.code === Code.Unavailable || e.code === Code.Internal || e.code === Code.Unknown ? tlsMismatch(causeText(e), context) : undefined;
  if (mismatch) {
    // The original text stays, for whoever debugs the connection.
    const message = mismatch.message === undefined ? raw : `${mismatch.message} (${opensslReason(e.rawMessage) === undefined ? raw : codeOf(e) ?? raw})`;
    return { code: mismatch.code, message, details: [], hints: [mismatch.hint], exitCode: EXIT.failure };
  }
  if (e.code === Code.DeadlineExceeded && (context.timeout ?? 0) > 0) {
    return { code: snakeCodeName(e.code), message: `${raw} (--timeout ${context.timeout} ms)`, details: [], hints: ["raise --timeout, or give 0 for no deadline"], exitCode: EXIT.failure };
  }
  return { code: snakeCodeName(e.code), message: raw, details: [], hints: [], exitCode: EXIT.failure };
}

/** The first Node error code along the cause chain (ERR_SSL_WRONG_VERSION_NUMBER, ECONNRESET, …). */
function codeOf(err: unknown): string | undefined {
  let at: unknown = err;
  for (let depth = 0; at instanceof Error && depth < 8; depth++) {
    const code = (at as NodeJS.ErrnoException).code;
    if (typeof code === "string") return code;
    at = at.cause;
  }
  return undefined;
}

/** What `err` looks like as an error line, its hints and its exit code. */
export function describeError(err: unknown, context: ConnectionContext = {}): Described {
  if (err instanceof CliError) return { code: err.code, message: err.message, details: err.details, hints: err.hints, exitCode: err.exitCode };
  if (err instanceof CommanderError) {
    // An option value checked inside an action (commander's own parse errors never get here).
    return { code: "usage", message: err.message.replace(/^error: /, ""), details: [], hints: [], exitCode: EXIT.usage };
  }
  if (err instanceof ConnectError) return describeCall(err, context);
  if (err instanceof Error) {
    const errno = (err as NodeJS.ErrnoException).code;
    if (typeof errno === "string" && /^E[A-Z0-9]+$/.test(errno)) return { code: "io", message: err.message, details: [], hints: [], exitCode: EXIT.failure };
    return { code: snakeCodeName(Code.Unknown), message: err.message, details: [], hints: [], exitCode: EXIT.failure };
  }
  return { code: snakeCodeName(Code.Unknown), message: String(err), details: [], hints: [], exitCode: EXIT.failure };
}

/** `mmgate images generate:`, or `mmgate:` for the root. */
function prefix(command: string): string {
  return command === "" ? "mmgate:" : `mmgate ${command}:`;
}

/** The lines of a described failure, each ending in a newline. */
export function formatError(command: string, d: Pick<Described, "code" | "message" | "details" | "hints">): string {
  return [`${prefix(command)} [${d.code}] ${d.message}`, ...d.details, ...d.hints.map((h) => `hint: ${h}`)].map((line) => `${line}\n`).join("");
}

/** Anything with a write(text), as process.stderr and the commands' test sinks are. */
export interface Sink {
  write(text: string): unknown;
}

/** Writes `err` to `sink` in the one format and returns the exit code it calls for. */
export function reportError(sink: Sink, command: string, err: unknown, context: ConnectionContext = {}): number {
  const d = describeError(err, context);
  sink.write(formatError(command, d));
  return d.exitCode;
}

/** `mmgate <command>: warning: message`. */
export function reportWarning(sink: Sink, command: string, message: string): void {
  sink.write(`${prefix(command)} warning: ${message}\n`);
}

/** The context for reporting a call made with these connection options. */
export function connectionContext(options: { addr?: string; tls?: boolean; ca?: string | undefined; cert?: string | undefined; timeout?: number }): ConnectionContext {
  return {
    ...(options.addr !== undefined ? { addr: options.addr } : {}),
    tls: options.tls === true || options.ca !== undefined || options.cert !== undefined,
    ...(options.timeout !== undefined ? { timeout: options.timeout } : {}),
  };
}
