/** Stable codes of LlmJsonError. */
export type LlmJsonErrorCode =
  /** The input exceeds the byte limit. */
  | "TOO_LARGE"
  /** Arrays and objects nest deeper than the depth limit. */
  | "TOO_DEEP"
  /** Not JSON. */
  | "SYNTAX"
  /** An object names the same key twice. */
  | "DUPLICATE_KEY"
  /** A value has the wrong JSON type. */
  | "TYPE"
  /** A number is out of the field's range or not an integer where one is needed. */
  | "RANGE"
  /** A required key is missing. */
  | "MISSING"
  /** A string or tag names no known variant. */
  | "UNKNOWN_VARIANT"
  /** A string does not have the field's format (hex ids). */
  | "FORMAT"
  /** An integer inside a free-form JSON field is not exact as a double. */
  | "LOSSY_NUMBER";

/**
 * Bad reference JSON: a stable code and the JSON path of the offending
 * value ("$" for the document, "$.multi_modal_data.image[0]" below it).
 */
export class LlmJsonError extends Error {
  override readonly name = "LlmJsonError";
  constructor(
    readonly code: LlmJsonErrorCode,
    readonly path: string,
    detail: string,
  ) {
    super(`${path}: ${detail}`);
  }
}
