/**
 * Plain HTTP plumbing shared by the routes: header access, content-type
 * and size checks, reading a bounded body, and JSON answers. Works on
 * HTTP/1.1 and HTTP/2 request/response objects alike.
 */
import type { HttpRouteRequest, HttpRouteResponse } from "../../server/index.js";
import { OpenAiApiError } from "./errors.js";

/** The subset of a Node response both protocols share. */
interface JsonWritable {
  writeHead(status: number, headers: Record<string, string>): unknown;
  end(body: string): unknown;
  readonly headersSent: boolean;
  readonly destroyed: boolean;
}

/** One header as a string (the first when repeated), or undefined. */
export function headerOf(req: HttpRouteRequest, name: string): string | undefined {
  const value = req.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** The media type of the request (lowercase, parameters dropped), or "" when none is sent. */
export function mediaTypeOf(req: HttpRouteRequest): string {
  return (headerOf(req, "content-type") ?? "").split(";", 1)[0]!.trim().toLowerCase();
}

export function unsupportedMediaType(expected: string, got: string): OpenAiApiError {
  return new OpenAiApiError(
    415,
    `this endpoint takes ${expected}, not ${got === "" ? "a body without content-type" : got}`,
    "invalid_request_error",
    null,
    "unsupported_media_type",
  );
}

export function tooLarge(limit: number): OpenAiApiError {
  return new OpenAiApiError(413, `the request body is larger than ${limit} bytes`, "invalid_request_error", null, "request_too_large");
}

/**
 * Refuses bodies we cannot read: compressed ones, and those whose declared
 * length is over the limit (answered before a byte is read).
 */
export function checkBodyHeaders(req: HttpRouteRequest, limit: number): void {
  const encoding = (headerOf(req, "content-encoding") ?? "identity").trim().toLowerCase();
  if (encoding !== "identity" && encoding !== "") {
    throw new OpenAiApiError(415, `content-encoding ${encoding} is not accepted; send the body uncompressed`, "invalid_request_error", null, "unsupported_media_type");
  }
  const declared = headerOf(req, "content-length");
  if (declared !== undefined && /^\d+$/.test(declared) && Number(declared) > limit) throw tooLarge(limit);
}

/**
 * Feeds the body to `onChunk` until it ends, failing with 413 past `limit`
 * bytes. A failure stops reading; the rest of the body is discarded and the
 * host closes what was left unread once the answer is out.
 */
export function pumpBody(
  req: HttpRouteRequest,
  limit: number,
  signal: AbortSignal,
  onChunk: (chunk: Buffer) => void,
): { done: Promise<void>; stop(): void } {
  let stop = () => undefined as void;
  const done = new Promise<void>((resolve, reject) => {
    let total = 0;
    const cleanup = () => {
      req.removeListener("data", onData);
      req.removeListener("end", onEnd);
      req.removeListener("error", onError);
      signal.removeEventListener("abort", onAbort);
    };
    const fail = (error: unknown) => {
      cleanup();
      req.resume();
      reject(error);
    };
    const onData = (chunk: Buffer) => {
      total += chunk.length;
      if (total > limit) return fail(tooLarge(limit));
      try {
        onChunk(chunk);
      } catch (error) {
        fail(error);
      }
    };
    const onEnd = () => {
      cleanup();
      resolve();
    };
    const onError = (error: unknown) => fail(error);
    const onAbort = () => fail(signal.reason);
    stop = () => {
      cleanup();
      req.resume();
    };
    if (signal.aborted) return onAbort();
    req.on("data", onData);
    req.once("end", onEnd);
    req.once("error", onError);
    signal.addEventListener("abort", onAbort, { once: true });
  });
  return { done, stop: () => stop() };
}

/** The whole body, at most `limit` bytes. */
export async function readBody(req: HttpRouteRequest, limit: number, signal: AbortSignal): Promise<Buffer> {
  const chunks: Buffer[] = [];
  await pumpBody(req, limit, signal, (chunk) => chunks.push(chunk)).done;
  return Buffer.concat(chunks);
}

/** A JSON body: 415 for another content type, 413 over the limit, 400 when it does not parse. */
export async function readJson(req: HttpRouteRequest, limit: number, signal: AbortSignal): Promise<unknown> {
  const type = mediaTypeOf(req);
  if (type !== "application/json") throw unsupportedMediaType("application/json", type);
  checkBodyHeaders(req, limit);
  const body = await readBody(req, limit, signal);
  try {
    return JSON.parse(body.toString("utf8")) as unknown;
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    throw new OpenAiApiError(400, `the request body is not valid JSON: ${reason}`, "invalid_request_error", null, "invalid_json");
  }
}

/** A complete JSON answer, unless the client is already gone or an answer has begun. */
export function sendJson(res: HttpRouteResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const out = res as unknown as JsonWritable;
  if (out.headersSent || out.destroyed) return;
  const text = JSON.stringify(body);
  out.writeHead(status, {
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(text)),
    ...headers,
  });
  out.end(text);
}

export function sendError(res: HttpRouteResponse, error: OpenAiApiError, headers: Record<string, string> = {}): void {
  sendJson(res, error.status, error.body(), { ...headers, ...error.headers });
}
