/** Element type of a decoded tensor; the reference has only UINT8. */
export type DataType = "UINT8";

/** Hash discriminant of each data type (widen when a type is added). */
export const DTYPE_BYTE: Record<DataType, number> = { UINT8: 0 };

/** Most dimensions a tensor may have (images have 3, videos 4). */
export const MAX_TENSOR_RANK = 8;

/** Most sampled timestamps or frame indices video metadata may carry. */
export const MAX_VIDEO_FRAMES = 65_536;

export type ColorType = "L8" | "La8" | "Rgb8" | "Rgba8";

/** Source format names as the reference's image crate spells them. */
export type ImageFormat = "Png" | "Jpeg" | "WebP" | "Gif" | "Tiff" | "Avif" | "Bmp";

export interface ImageMetadata {
  readonly format: ImageFormat | null;
  readonly color_type: ColorType;
  readonly layout: "HWC";
}

/**
 * Video metadata in declaration order. The last two fields are optional so
 * that the three-field form hashes exactly as the seed's struct does.
 */
export interface VideoMetadata {
  readonly source_fps: number;
  readonly source_duration: number;
  readonly sampled_timestamps: readonly number[];
  readonly source_total_frames?: number;
  readonly frames_indices?: readonly number[];
}

/** Externally tagged, as the reference serializes it. */
export type DecodedMediaMetadata = { readonly Image: ImageMetadata } | { readonly Video: VideoMetadata };

export interface MediaTensorInfo {
  readonly shape: readonly number[];
  readonly dtype: DataType;
  readonly metadata: DecodedMediaMetadata | null;
}

/** Decoded bytes with their description and (when computed) content hash. */
export interface DecodedMedia {
  readonly data: Uint8Array;
  readonly tensorInfo: MediaTensorInfo;
  readonly contentHash: bigint | null;
}

export function isVideoMetadata(m: DecodedMediaMetadata | null): m is { readonly Video: VideoMetadata } {
  return m !== null && "Video" in m;
}

export function isImageMetadata(m: DecodedMediaMetadata | null): m is { readonly Image: ImageMetadata } {
  return m !== null && "Image" in m;
}
