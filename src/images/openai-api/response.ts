/**
 * ImageService answers in OpenAI's shapes: the images response of a
 * non-streaming call and the `*.partial_image` / `*.completed` events of a
 * stream. Every stream event carries `image_index`, which OpenAI's have
 * not: here one stream may carry several images.
 */
import {
  Background,
  OutputFormat,
  Quality,
  type GeneratedImage,
  type GenerationParameters,
  type ImageResponse,
  type Usage,
} from "../../../gen/mmgate/images/v1/images_pb.js";
import type { ImageParams, Operation, ResponseFormatName } from "./params.js";

export interface OpenAiUsage {
  input_tokens?: number;
  output_tokens?: number;
  total_tokens?: number;
}

export interface OpenAiImage {
  b64_json?: string;
  url?: string;
  revised_prompt?: string;
}

export interface OpenAiImagesResponse {
  created: number;
  data: OpenAiImage[];
  usage?: OpenAiUsage;
  background?: "transparent" | "opaque";
  output_format?: "png" | "jpeg" | "webp";
  quality?: "low" | "medium" | "high";
  size?: string;
}

/** The settings every stream event repeats. */
interface EventSettings {
  size: string;
  quality: string;
  background: string;
  output_format: string;
}

export interface PartialImageEvent extends EventSettings {
  type: string;
  b64_json: string;
  created_at: number;
  partial_image_index: number;
  image_index: number;
}

export interface CompletedEvent extends EventSettings {
  type: string;
  b64_json: string;
  created_at: number;
  image_index: number;
  usage?: OpenAiUsage;
}

/** OpenAI's event names: generations and edits have their own. */
export function eventTypes(operation: Operation): { partial: string; completed: string } {
  const prefix = operation === "edit" ? "image_edit" : "image_generation";
  return { partial: `${prefix}.partial_image`, completed: `${prefix}.completed` };
}

const QUALITY_NAMES: Partial<Record<Quality, "auto" | "low" | "medium" | "high">> = {
  [Quality.AUTO]: "auto",
  [Quality.LOW]: "low",
  [Quality.MEDIUM]: "medium",
  [Quality.HIGH]: "high",
};
const FORMAT_NAMES: Partial<Record<OutputFormat, "png" | "jpeg" | "webp">> = {
  [OutputFormat.PNG]: "png",
  [OutputFormat.JPEG]: "jpeg",
  [OutputFormat.WEBP]: "webp",
};
const BACKGROUND_NAMES: Partial<Record<Background, "auto" | "opaque" | "transparent">> = {
  [Background.AUTO]: "auto",
  [Background.OPAQUE]: "opaque",
  [Background.TRANSPARENT]: "transparent",
};
const MEDIA_TYPES: Readonly<Record<"png" | "jpeg" | "webp", string>> = { png: "image/png", jpeg: "image/jpeg", webp: "image/webp" };

const seconds = (value: bigint | number): number => (typeof value === "bigint" ? Number(value) : value);

export function base64Of(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
}

function payloadBase64(image: GeneratedImage): string {
  if (image.payload.case === "image") return base64Of(image.payload.value);
  if (image.payload.case === "b64Json") return image.payload.value;
  return "";
}

/** The token counts the provider reported, or undefined when it reported none. */
export function usageOf(usage: Usage | undefined): OpenAiUsage | undefined {
  if (!usage) return undefined;
  const out: OpenAiUsage = {};
  if (usage.inputTokens !== undefined) out.input_tokens = Number(usage.inputTokens);
  if (usage.outputTokens !== undefined) out.output_tokens = Number(usage.outputTokens);
  if (usage.totalTokens !== undefined) out.total_tokens = Number(usage.totalTokens);
  else if (out.input_tokens !== undefined && out.output_tokens !== undefined) out.total_tokens = out.input_tokens + out.output_tokens;
  return Object.keys(out).length > 0 ? out : undefined;
}

/** "WxH" of the images when they all share one size, else the size the request settled on. */
function sizeOf(response: ImageResponse): string {
  const sizes = new Set(response.data.map((image) => `${image.width}x${image.height}`));
  const [only] = sizes;
  if (sizes.size === 1 && only !== undefined) return only;
  return response.effective?.size || "auto";
}

function formatOf(image: GeneratedImage | undefined, effective: GenerationParameters | undefined): "png" | "jpeg" | "webp" {
  return FORMAT_NAMES[image?.format ?? OutputFormat.UNSPECIFIED] ?? FORMAT_NAMES[effective?.outputFormat ?? OutputFormat.UNSPECIFIED] ?? "png";
}

function sortedImages(response: ImageResponse): GeneratedImage[] {
  return [...response.data].sort((a, b) => a.index - b.index);
}

/** The answer of a non-streaming call: images in requested order, with `url` a data: URL when asked for. */
export function imagesResponseOf(response: ImageResponse, responseFormat: ResponseFormatName): OpenAiImagesResponse {
  const effective = response.effective;
  const data = sortedImages(response).map((image): OpenAiImage => {
    const b64 = payloadBase64(image);
    const out: OpenAiImage = responseFormat === "url" ? { url: `data:${MEDIA_TYPES[formatOf(image, effective)]};base64,${b64}` } : { b64_json: b64 };
    if (response.revisedPrompt !== undefined) out.revised_prompt = response.revisedPrompt;
    return out;
  });
  const out: OpenAiImagesResponse = { created: seconds(response.created), data };
  const usage = usageOf(response.usage);
  if (usage) out.usage = usage;
  const background = BACKGROUND_NAMES[effective?.background ?? Background.UNSPECIFIED];
  if (background === "opaque" || background === "transparent") out.background = background;
  out.output_format = formatOf(response.data[0], effective);
  const quality = QUALITY_NAMES[effective?.quality ?? Quality.UNSPECIFIED];
  if (quality !== undefined && quality !== "auto") out.quality = quality;
  if (response.data.length > 0) out.size = sizeOf(response);
  return out;
}

/** What a partial image event says about the request: the values asked for, defaults filled in. */
export function requestedSettings(params: ImageParams): EventSettings {
  return {
    size: params.size ?? "auto",
    quality: params.quality ?? "auto",
    background: params.background ?? "auto",
    output_format: params.outputFormat ?? "png",
  };
}

export function partialImageEvent(
  operation: Operation,
  settings: EventSettings,
  image: { index: number; partialIndex: number; bytes: Uint8Array },
  createdAt: number,
): PartialImageEvent {
  return {
    type: eventTypes(operation).partial,
    b64_json: base64Of(image.bytes),
    created_at: createdAt,
    ...settings,
    partial_image_index: image.partialIndex,
    image_index: image.index,
  };
}

/**
 * One completed event per image, in index order. The request's usage
 * covers every image, so it rides on the last event only: summing the
 * events' usage gives the request's.
 */
export function completedEvents(operation: Operation, response: ImageResponse): CompletedEvent[] {
  const effective = response.effective;
  const images = sortedImages(response);
  const usage = usageOf(response.usage);
  const quality = QUALITY_NAMES[effective?.quality ?? Quality.UNSPECIFIED] ?? "auto";
  const background = BACKGROUND_NAMES[effective?.background ?? Background.UNSPECIFIED] ?? "auto";
  return images.map((image, position) => {
    const event: CompletedEvent = {
      type: eventTypes(operation).completed,
      b64_json: payloadBase64(image),
      created_at: seconds(response.created),
      size: `${image.width}x${image.height}`,
      quality,
      background,
      output_format: formatOf(image, effective),
      image_index: image.index,
    };
    if (usage && position === images.length - 1) event.usage = usage;
    return event;
  });
}
