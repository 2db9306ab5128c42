/**
 * Lines of a byte stream, each held to a byte limit while it is read: the
 * reader tracks the current line's length across chunks and fails as soon as
 * it passes the limit, without accumulating the rest (or reading any more of
 * the stream). readline would read a 200 MB line whole before anyone could
 * look at its length.
 *
 * Lines end as readline ends them (with `crlfDelay: Infinity`): at "\n", at
 * "\r\n" (also when a chunk ends between the two) and at a lone "\r"; the
 * last line is yielded when it has any byte, so a final line break adds no
 * empty line. Each line is decoded as UTF-8 once it is complete (malformed
 * bytes become U+FFFD); its length is counted in the stream's bytes. Line
 * breaks are single bytes that never occur inside a UTF-8 sequence, so
 * splitting bytes is splitting characters.
 */

/** A line passed `maxBytes` bytes; `line` is its 1-based number. */
export class LineTooLongError extends Error {
  override readonly name = "LineTooLongError";
  constructor(
    readonly line: number,
    readonly maxBytes: number,
  ) {
    super(`line ${line} is longer than ${maxBytes} bytes`);
  }
}

const LF = 0x0a;
const CR = 0x0d;

/**
 * The lines of `input` (Buffers, Uint8Arrays or strings, as a Readable
 * yields them), each without its line break. Throws LineTooLongError once
 * the current line has more than `maxLineBytes` bytes, having read at most
 * the chunk that took it there; errors of `input` are thrown as they are.
 * Stopping early (a throw, `break`) returns `input`'s iterator, which for a
 * Readable destroys it.
 */
export async function* boundedLines(input: AsyncIterable<string | Uint8Array> | Iterable<string | Uint8Array>, maxLineBytes: number): AsyncGenerator<string, void, undefined> {
  let parts: Uint8Array[] = [];
  let length = 0;
  let line = 1;
  /** The previous chunk ended with "\r": a "\n" first in the next one belongs to that break. */
  let afterCr = false;
  const take = (): string => {
    const text = parts.length === 1 ? Buffer.from(parts[0]!.buffer, parts[0]!.byteOffset, parts[0]!.byteLength).toString("utf8") : Buffer.concat(parts, length).toString("utf8");
    parts = [];
    length = 0;
    line += 1;
    return text;
  };
  for await (const chunk of input) {
    const bytes = typeof chunk === "string" ? Buffer.from(chunk, "utf8") : chunk;
    let start = 0;
    if (afterCr && bytes.length > 0) {
      if (bytes[0] === LF) start = 1;
      afterCr = false;
    }
    for (let at = start; at < bytes.length; at++) {
      const byte = bytes[at]!;
      if (byte !== LF && byte !== CR) continue;
      const piece = at - start;
      if (length + piece > maxLineBytes) throw new LineTooLongError(line, maxLineBytes);
      if (piece > 0) parts.push(bytes.subarray(start, at));
      length += piece;
      yield take();
      if (byte === CR) {
        if (at + 1 < bytes.length) {
          if (bytes[at + 1] === LF) at += 1;
        } else {
          afterCr = true;
        }
      }
      start = at + 1;
    }
    const rest = bytes.length - start;
    if (length + rest > maxLineBytes) throw new LineTooLongError(line, maxLineBytes);
    if (rest > 0) {
      parts.push(start === 0 ? bytes : bytes.subarray(start));
      length += rest;
    }
  }
  if (length > 0) yield take();
}
