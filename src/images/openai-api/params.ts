/**
 * The parameters of an OpenAI images request, read from a JSON body
 * (generations) or multipart form fields (edits) and checked one by one:
 * the first problem is answered as a 400 naming its parameter, as OpenAI
 * does. Only what the HTTP shape decides is checked here (types, enums,
 * unknown names); the service validates the request as it does any other.
 */
import { invalidParam } from "./errors.js";
import type { Background, InputFidelity, Moderation, OutputFormat, Quality } from "../model.js";

/** Highest `n` any request may carry (the service's ceiling); the provider's advertised limit is checked later. */
export const MAX_N = 255;
/** OpenAI's range of partial images. */
export const MAX_PARTIAL_IMAGES = 3;

export type Operation = "generate" | "edit";
// OpenAI's names for these are the image model's own.
export type QualityName = Quality;
export type FormatName = OutputFormat;
export type BackgroundName = Background;
export type ModerationName = Moderation;
export type FidelityName = InputFidelity;
export type ResponseFormatName = "b64_json" | "url";

/** A file part of a multipart body. */
export interface UploadedFile {
  readonly field: string;
  readonly data: Buffer;
  readonly filename: string;
  readonly mimeType: string;
}

export interface ImageParams {
  readonly operation: Operation;
  readonly prompt: string;
  readonly model?: string;
  readonly n?: number;
  readonly size?: string;
  readonly quality?: QualityName;
  readonly outputFormat?: FormatName;
  readonly outputCompression?: number;
  readonly background?: BackgroundName;
  readonly moderation?: ModerationName;
  readonly inputFidelity?: FidelityName;
  readonly responseFormat: ResponseFormatName;
  readonly user?: string;
  readonly stream: boolean;
  /** As asked; the route caps it at what the provider advertises. */
  readonly partialImages: number;
  /** Edit source images, in the order sent. */
  readonly images: readonly UploadedFile[];
  readonly mask?: UploadedFile;
}

/** Where the values come from: JSON keeps its types, a form sends every value as text. */
interface Source {
  readonly kind: "json" | "form";
  /** Parameter names in the order they arrived. */
  readonly names: readonly string[];
  /** The value, or undefined when absent; JSON null counts as absent (OpenAI's clients send it for "default"). */
  value(name: string): unknown;
}

const COMMON = [
  "prompt",
  "model",
  "n",
  "size",
  "quality",
  "output_format",
  "output_compression",
  "background",
  "moderation",
  "response_format",
  "user",
  "stream",
  "partial_images",
];
const KNOWN: Readonly<Record<Operation, ReadonlySet<string>>> = {
  generate: new Set(COMMON),
  edit: new Set([...COMMON, "input_fidelity"]),
};
/** OpenAI parameters this server knows and cannot honour, with the reason. */
const UNSUPPORTED: Readonly<Record<string, string>> = {
  style: "style is a dall-e-3 parameter; the providers here take no style",
};

const describe = (value: unknown): string => (Array.isArray(value) ? "an array" : value === null ? "null" : `a ${typeof value}`);

class Reader {
  constructor(private readonly source: Source) {}

  string(name: string): string | undefined {
    const value = this.source.value(name);
    if (value === undefined) return undefined;
    if (typeof value !== "string") throw invalidParam(name, `${name} must be a string, not ${describe(value)}`, "invalid_type");
    return value;
  }

  integer(name: string, min: number, max: number): number | undefined {
    const value = this.source.value(name);
    if (value === undefined) return undefined;
    let number: number;
    if (this.source.kind === "json") {
      if (typeof value !== "number") throw invalidParam(name, `${name} must be an integer, not ${describe(value)}`, "invalid_type");
      number = value;
    } else {
      const text = String(value).trim();
      if (!/^-?\d{1,15}$/.test(text)) throw invalidParam(name, `${name} must be an integer, not ${JSON.stringify(text)}`, "invalid_type");
      number = Number(text);
    }
    if (!Number.isInteger(number)) throw invalidParam(name, `${name} must be an integer, not ${number}`, "invalid_type");
    if (number < min || number > max) throw invalidParam(name, `${name} must be between ${min} and ${max}, not ${number}`);
    return number;
  }

  boolean(name: string): boolean | undefined {
    const value = this.source.value(name);
    if (value === undefined) return undefined;
    if (typeof value === "boolean") return value;
    if (this.source.kind === "form" && typeof value === "string") {
      const text = value.trim().toLowerCase();
      if (text === "true") return true;
      if (text === "false") return false;
    }
    throw invalidParam(name, `${name} must be true or false`, "invalid_type");
  }

  oneOf<T extends string>(name: string, allowed: readonly T[], hint?: (value: string) => string | undefined): T | undefined {
    const value = this.string(name);
    if (value === undefined) return undefined;
    if ((allowed as readonly string[]).includes(value)) return value as T;
    const extra = hint?.(value);
    throw invalidParam(name, `${name} must be one of ${allowed.join(", ")}, not ${JSON.stringify(value)}${extra ? ` (${extra})` : ""}`);
  }
}

function checkNames(source: Source, operation: Operation): void {
  for (const name of source.names) {
    if (KNOWN[operation].has(name)) continue;
    const reason = Object.hasOwn(UNSUPPORTED, name) ? UNSUPPORTED[name] : undefined;
    if (reason !== undefined) throw invalidParam(name, `${name} is not supported: ${reason}`, "unsupported_parameter");
    throw invalidParam(name, `unknown parameter: ${name}`, "unknown_parameter");
  }
}

const DALL_E_QUALITY = (value: string) => (value === "standard" || value === "hd" ? `${value} is a dall-e quality` : undefined);

function readParams(source: Source, operation: Operation, files: Pick<ImageParams, "images" | "mask">): ImageParams {
  checkNames(source, operation);
  const read = new Reader(source);
  const prompt = read.string("prompt");
  if (prompt === undefined) throw invalidParam("prompt", "prompt is required", "missing_required_parameter");
  const stream = read.boolean("stream") ?? false;
  const responseFormat = read.oneOf<ResponseFormatName>("response_format", ["b64_json", "url"]) ?? "b64_json";
  if (stream && responseFormat === "url") {
    throw invalidParam("response_format", "streamed images are always sent as b64_json; response_format url needs stream false");
  }
  const params: {
    -readonly [K in keyof ImageParams]: ImageParams[K];
  } = {
    operation,
    prompt,
    responseFormat,
    stream,
    partialImages: read.integer("partial_images", 0, MAX_PARTIAL_IMAGES) ?? 0,
    ...files,
  };
  const set = <K extends keyof ImageParams>(key: K, value: ImageParams[K] | undefined) => {
    if (value !== undefined) params[key] = value;
  };
  set("model", read.string("model"));
  set("n", read.integer("n", 1, MAX_N));
  set("size", read.string("size"));
  set("quality", read.oneOf<QualityName>("quality", ["auto", "low", "medium", "high"], DALL_E_QUALITY));
  set("outputFormat", read.oneOf<FormatName>("output_format", ["png", "jpeg", "webp"]));
  set("outputCompression", read.integer("output_compression", 0, 100));
  set("background", read.oneOf<BackgroundName>("background", ["auto", "opaque", "transparent"]));
  set("moderation", read.oneOf<ModerationName>("moderation", ["auto", "low"]));
  if (operation === "edit") set("inputFidelity", read.oneOf<FidelityName>("input_fidelity", ["low", "high"]));
  set("user", read.string("user"));
  return params;
}

/** A generations request from its parsed JSON body. */
export function generationParams(body: unknown): ImageParams {
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw invalidParam(null, `the request body must be a JSON object, not ${describe(body)}`, "invalid_type");
  }
  const record = body as Record<string, unknown>;
  const source: Source = {
    kind: "json",
    // A null parameter is an absent one, even an unsupported name: clients send null for "default".
    names: Object.keys(record).filter((name) => record[name] !== null),
    value: (name) => (Object.hasOwn(record, name) && record[name] !== null ? record[name] : undefined),
  };
  return readParams(source, "generate", { images: [] });
}

/** Field names a form may use for the source images: OpenAI's SDKs send `image` for one file and `image[]` for several. */
const IMAGE_FIELDS = new Set(["image", "image[]"]);

/** An edits request from its multipart form: text fields in order, then the file parts. */
export function editParams(fields: readonly (readonly [string, string])[], files: readonly UploadedFile[]): ImageParams {
  const values = new Map<string, string>();
  for (const [name, value] of fields) {
    if (IMAGE_FIELDS.has(name) || name === "mask") throw invalidParam(name, `${name} must be a file part, not a text field`, "invalid_type");
    if (values.has(name)) throw invalidParam(name, `${name} is sent more than once`);
    values.set(name, value);
  }
  const images: UploadedFile[] = [];
  let mask: UploadedFile | undefined;
  for (const file of files) {
    if (IMAGE_FIELDS.has(file.field)) images.push(file);
    else if (file.field === "mask") {
      if (mask) throw invalidParam("mask", "only one mask may be sent");
      mask = file;
    } else throw invalidParam(file.field, `unknown file parameter: ${file.field} (files go in image, image[] or mask)`, "unknown_parameter");
  }
  const source: Source = { kind: "form", names: [...values.keys()], value: (name) => values.get(name) };
  const params = readParams(source, "edit", mask ? { images, mask } : { images });
  if (images.length === 0) throw invalidParam("image", "image is required: send the source image(s) as file parts", "missing_required_parameter");
  return params;
}
