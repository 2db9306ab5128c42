/**
 * A multipart/form-data body, as OpenAI's SDKs send image edits, read with
 * busboy under limits: the whole body (413 past it), the number of files,
 * and the number and size of text fields (400 past them).
 */
import { Busboy } from "@fastify/busboy";
import type { HttpRouteRequest } from "../../server/index.js";
import { invalidParam, OpenAiApiError } from "./errors.js";
import { checkBodyHeaders, headerOf, mediaTypeOf, pumpBody, unsupportedMediaType } from "./http.js";
import type { UploadedFile } from "./params.js";

export interface MultipartLimits {
  /** The whole body, files included. */
  readonly maxBytes: number;
  readonly maxFiles: number;
  readonly maxFields: number;
  /** One text field's value. */
  readonly maxFieldBytes: number;
}

export interface MultipartBody {
  /** Text fields in the order sent. */
  readonly fields: (readonly [string, string])[];
  readonly files: UploadedFile[];
}

const malformed = (reason: string) => new OpenAiApiError(400, `the multipart body is malformed: ${reason}`, "invalid_request_error", null, "invalid_multipart");

/** Reads the whole form into memory: 415 unless the body is multipart/form-data. */
export async function readMultipart(req: HttpRouteRequest, limits: MultipartLimits, signal: AbortSignal): Promise<MultipartBody> {
  const type = mediaTypeOf(req);
  if (type !== "multipart/form-data") throw unsupportedMediaType("multipart/form-data", type);
  checkBodyHeaders(req, limits.maxBytes);
  let parser: ReturnType<typeof Busboy>;
  try {
    parser = Busboy({
      headers: { "content-type": headerOf(req, "content-type") ?? "" },
      limits: {
        files: limits.maxFiles,
        fields: limits.maxFields,
        parts: limits.maxFiles + limits.maxFields,
        fieldSize: limits.maxFieldBytes,
      },
    });
  } catch (error) {
    throw malformed(error instanceof Error ? error.message : String(error));
  }
  const fields: (readonly [string, string])[] = [];
  // Parts arrive one after another, so files end in the order they were sent.
  const files: UploadedFile[] = [];
  const pendingFiles: Promise<void>[] = [];
  let failure: unknown;
  let rejectStopped!: (error: unknown) => void;
  const stopped = new Promise<never>((_, reject) => (rejectStopped = reject));
  stopped.catch(() => undefined);
  // The first problem wins: reading stops and later events of the parse are ignored.
  const fail = (error: unknown) => {
    if (failure !== undefined) return;
    failure = error;
    // Parser events come from chunks the body pump fed, so it exists by then.
    body.stop();
    rejectStopped(error);
  };

  parser.on("field", (name, value, _nameTruncated, valueTruncated) => {
    if (valueTruncated) fail(invalidParam(name, `${name} is longer than ${limits.maxFieldBytes} bytes`));
    else fields.push([name, value]);
  });
  parser.on("file", (field, stream, filename, _encoding, mimeType) => {
    const chunks: Buffer[] = [];
    pendingFiles.push(
      new Promise<void>((resolve) => {
        stream.on("data", (chunk: Buffer) => chunks.push(chunk));
        stream.once("end", () => {
          // A part sent without filename= (or type) still counts as a file: both may be absent.
          files.push({ field, data: Buffer.concat(chunks), filename: filename ?? "", mimeType: mimeType ?? "" });
          resolve();
        });
        stream.once("error", (error) => {
          fail(malformed(error.message));
          resolve();
        });
      }),
    );
  });
  parser.on("filesLimit", () => fail(invalidParam("image", `at most ${limits.maxFiles} files (images and mask) may be sent`, "too_many_files")));
  parser.on("fieldsLimit", () => fail(invalidParam(null, `at most ${limits.maxFields} text fields may be sent`, "too_many_fields")));
  parser.on("partsLimit", () => fail(invalidParam(null, `at most ${limits.maxFiles + limits.maxFields} parts may be sent`, "too_many_parts")));
  parser.on("error", (error: unknown) => fail(malformed(error instanceof Error ? error.message : String(error))));
  const finished = new Promise<void>((resolve) => parser.once("finish", resolve));

  // The parser's buffer is not waited on: the body limit already bounds what it can hold.
  const body = pumpBody(req, limits.maxBytes, signal, (chunk) => void parser.write(chunk));
  body.done.catch(fail);
  try {
    await Promise.race([body.done, stopped]);
    parser.end();
    await Promise.race([finished, stopped]);
    await Promise.race([Promise.all(pendingFiles), stopped]);
  } finally {
    if (failure !== undefined) parser.destroy();
  }
  return { fields, files };
}
