/**
 * An OpenAI images request as an mmgate.images.v1.ImageRequest: flat
 * parameters become GenerationParameters, the model becomes the route,
 * uploaded files the EditOperation.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  Background,
  InputFidelity,
  Moderation,
  OutputFormat,
  Quality,
  ResponseFormat,
  type ImageRequestSchema,
} from "../../../gen/mmgate/images/v1/images_pb.js";
import type { BackgroundName, FidelityName, FormatName, ImageParams, ModerationName, QualityName, UploadedFile } from "./params.js";

export type ImageRequestInit = MessageInitShape<typeof ImageRequestSchema>;

/** Where a request goes: empty means the service's default provider and that provider's model. */
export interface Routing {
  readonly provider?: string;
  readonly model?: string;
}

const QUALITY: Readonly<Record<QualityName, Quality>> = {
  auto: Quality.AUTO,
  low: Quality.LOW,
  medium: Quality.MEDIUM,
  high: Quality.HIGH,
};
const FORMAT: Readonly<Record<FormatName, OutputFormat>> = { png: OutputFormat.PNG, jpeg: OutputFormat.JPEG, webp: OutputFormat.WEBP };
const BACKGROUND: Readonly<Record<BackgroundName, Background>> = {
  auto: Background.AUTO,
  opaque: Background.OPAQUE,
  transparent: Background.TRANSPARENT,
};
const MODERATION: Readonly<Record<ModerationName, Moderation>> = { auto: Moderation.AUTO, low: Moderation.LOW };
const FIDELITY: Readonly<Record<FidelityName, InputFidelity>> = { low: InputFidelity.LOW, high: InputFidelity.HIGH };

/** A safe single path component, as the service accepts it; anything else is dropped rather than refused. */
function filenameOf(name: string): string {
  const base = name.split(/[\\/]/).pop() ?? "";
  // eslint-disable-next-line no-control-regex
  if (base === "." || base === ".." || /[\u0000-\u001f\u007f]/.test(base) || Buffer.byteLength(base) > 160) return "";
  return base;
}

/**
 * An uploaded file as an ImageInput. Clients that do not know the type send
 * application/octet-stream; an empty media type lets the provider sniff.
 */
function inputOf(file: UploadedFile) {
  const mediaType = file.mimeType.toLowerCase().startsWith("image/") ? file.mimeType.toLowerCase() : "";
  return { data: new Uint8Array(file.data.buffer, file.data.byteOffset, file.data.byteLength), mediaType, filename: filenameOf(file.filename) };
}

/**
 * The ImageRequest of `params`, routed by `routing`. Images come back as
 * raw bytes (the smallest message); the HTTP answer base64-encodes them.
 * `partialImages` is the count the provider will be asked for (0 unless
 * streaming).
 */
export function toImageRequest(params: ImageParams, routing: Routing, partialImages: number): ImageRequestInit {
  const operation: ImageRequestInit["operation"] =
    params.operation === "edit"
      ? {
          case: "edit",
          value: { images: params.images.map(inputOf), ...(params.mask ? { mask: inputOf(params.mask) } : {}) },
        }
      : { case: "generate", value: {} };
  return {
    prompt: params.prompt,
    operation,
    parameters: {
      ...(params.n !== undefined ? { n: params.n } : {}),
      size: params.size ?? "",
      quality: params.quality ? QUALITY[params.quality] : Quality.UNSPECIFIED,
      outputFormat: params.outputFormat ? FORMAT[params.outputFormat] : OutputFormat.UNSPECIFIED,
      ...(params.outputCompression !== undefined ? { outputCompression: params.outputCompression } : {}),
      background: params.background ? BACKGROUND[params.background] : Background.UNSPECIFIED,
      moderation: params.moderation ? MODERATION[params.moderation] : Moderation.UNSPECIFIED,
      inputFidelity: params.inputFidelity ? FIDELITY[params.inputFidelity] : InputFidelity.UNSPECIFIED,
      partialImages,
    },
    routing: { provider: routing.provider ?? "", model: routing.model ?? "" },
    ...(params.user !== undefined ? { user: params.user } : {}),
    responseFormat: ResponseFormat.BYTES,
  };
}
