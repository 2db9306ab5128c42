import { Code } from "@connectrpc/connect";
import { codeFromString } from "@connectrpc/connect/protocol-connect";
import type { EnvelopeSink } from "../wire/index.js";
import { EnvelopeReader, FLAG_COMPRESSED, FLAG_END_STREAM, FLAG_TRAILERS } from "../wire/index.js";

/** Largest trailer or error body kept for reading the status. */
const MAX_CAPTURE_BYTES = 64 * 1024;

/** Which wire format carries a response's status in its body. */
export type BodyStatusFormat = "grpc-web" | "connect-stream" | "connect-unary" | "none";

/** Picks the format from the request's content type (the response mirrors it). */
export function bodyStatusFormat(contentType: string | undefined): BodyStatusFormat {
  const type = (contentType ?? "").toLowerCase();
  if (type.startsWith("application/grpc-web")) return "grpc-web";
  if (type.startsWith("application/grpc")) return "none"; // status in HTTP trailers
  if (type.startsWith("application/connect+")) return "connect-stream";
  return "connect-unary";
}

/**
 * Reads the status out of response bytes as they are written, for the
 * protocols that put it in the body: the gRPC-Web trailer frame (flag 0x80),
 * the Connect end-stream message (flag 0x02), and a Connect unary error
 * body. Only envelope headers are parsed; payloads are skipped unless they
 * are the small status frame itself.
 */
export class StatusSniffer implements EnvelopeSink {
  private readonly envelopes: EnvelopeReader | undefined;
  private statusFrame: Uint8Array | undefined;
  private readonly unaryBody: Uint8Array[] = [];
  private unaryBytes = 0;

  constructor(private readonly format: BodyStatusFormat) {
    if (format === "grpc-web" || format === "connect-stream") this.envelopes = new EnvelopeReader(this);
  }

  /** Whether response bytes need to pass through `write`. */
  get watchesBody(): boolean {
    return this.format !== "none";
  }

  write(chunk: Uint8Array): void {
    if (this.format === "none") return;
    if (this.format === "connect-unary") {
      if (this.unaryBytes + chunk.length <= MAX_CAPTURE_BYTES) {
        this.unaryBody.push(chunk);
        this.unaryBytes += chunk.length;
      }
      return;
    }
    this.envelopes!.push(chunk);
  }

  /** Takes the status frame, when it is small enough to keep; every other message is skipped. */
  wantsMessage(flags: number, length: number): boolean {
    const isStatus = this.format === "grpc-web" ? (flags & FLAG_TRAILERS) !== 0 : (flags & FLAG_END_STREAM) !== 0;
    return isStatus && length <= MAX_CAPTURE_BYTES;
  }

  onMessage(flags: number, payload: Uint8Array): boolean {
    // A compressed status frame is not decoded here. A copy: the writer's buffer is not the sniffer's to keep.
    if ((flags & FLAG_COMPRESSED) === 0) this.statusFrame = new Uint8Array(payload);
    return true;
  }

  /** Never called: the sniffer sets no size limit. */
  onOversize(): void {}

  /**
   * The status the body carried, if it carried one; 0 for OK. `httpStatus`
   * decides a Connect unary response: 200 is OK, anything else has a JSON
   * error body with a code.
   */
  /** The error message the body carried with its status, if any (read once the body is out). */
  message(): string | undefined {
    switch (this.format) {
      case "none":
        return undefined;
      case "connect-unary":
        return this.unaryBody.length === 0 ? undefined : messageOfJson(concat(this.unaryBody), (json) => json);
      case "connect-stream":
        return this.statusFrame === undefined ? undefined : messageOfJson(this.statusFrame, (json) => json.error);
      case "grpc-web": {
        if (this.statusFrame === undefined) return undefined;
        const match = /(?:^|\r\n)grpc-message:[ \t]*([^\r\n]*)/i.exec(new TextDecoder().decode(this.statusFrame));
        if (!match) return undefined;
        try {
          return decodeURIComponent(match[1]!);
        } catch {
          return match[1];
        }
      }
    }
  }

  status(httpStatus: number): Code | 0 | undefined {
    switch (this.format) {
      case "none":
        return undefined;
      case "connect-unary": {
        if (httpStatus === 200) return 0;
        return codeOfJson(concat(this.unaryBody), (json) => json);
      }
      case "connect-stream":
        if (this.statusFrame === undefined) return undefined;
        return codeOfJson(this.statusFrame, (json) => json.error, 0);
      case "grpc-web": {
        if (this.statusFrame === undefined) return undefined;
        const match = /(?:^|\r\n)grpc-status:\s*(\d+)/i.exec(new TextDecoder().decode(this.statusFrame));
        return match ? (Number(match[1]) as Code | 0) : undefined;
      }
    }
  }
}

function concat(parts: Uint8Array[]): Uint8Array {
  return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
}

/** `pick(json).code` as a Code; `absent` when pick finds no error object. */
function codeOfJson(
  bytes: Uint8Array,
  pick: (json: Record<string, unknown>) => unknown,
  absent?: Code | 0,
): Code | 0 | undefined {
  try {
    const json = JSON.parse(new TextDecoder().decode(bytes)) as Record<string, unknown>;
    const error = pick(json) as { code?: unknown } | undefined;
    if (error === undefined || error === null) return absent;
    return typeof error.code === "string" ? (codeFromString(error.code) ?? Code.Unknown) : Code.Unknown;
  } catch {
    return undefined;
  }
}

/** `pick(json).message` when it is a string. */
function messageOfJson(bytes: Uint8Array, pick: (json: Record<string, unknown>) => unknown): string | undefined {
  try {
    const error = pick(JSON.parse(new TextDecoder().decode(bytes)) as Record<string, unknown>) as { message?: unknown } | undefined;
    return typeof error?.message === "string" ? error.message : undefined;
  } catch {
    return undefined;
  }
}
