/** Why a keys file could not be used; `code` is stable, for tests and callers that branch on it. */
export type KeysFileErrorCode =
  /** It could not be read (missing, unreadable) or written. */
  | "io"
  /** It is not JSON or YAML. */
  | "parse"
  /** It holds nothing: a file caught half-written, or truncated. */
  | "empty"
  /** It parses but does not fit the schema (each problem in `problems`). */
  | "invalid"
  /** Its names clash with auth.token's or a certificate rule's. */
  | "conflict"
  /** The entry a command names is not there (`keys remove`), or already is (`keys add`). */
  | "not_found"
  | "exists"
  /** Another edit (`keys add|remove`) holds the file's lock. */
  | "locked";

/** A keys file that cannot be used as it is, with every problem found. */
export class KeysFileError extends Error {
  override readonly name = "KeysFileError";

  constructor(
    readonly code: KeysFileErrorCode,
    readonly file: string,
    readonly problems: readonly string[],
    options?: { cause?: unknown },
  ) {
    super(`${file}: ${problems.join("; ")}`, options);
  }
}
