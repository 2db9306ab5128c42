import { MediaError } from "./errors.js";
import type { MediaTensorInfo, VideoMetadata } from "./tensor.js";
import { MAX_VIDEO_FRAMES } from "./tensor.js";

const U64_MAX = (1n << 64n) - 1n;
const U32_MAX = 0xffff_ffffn;

export interface VideoDimensions {
  readonly frames: number;
  readonly width: number;
  readonly height: number;
}

function invalid(message: string): MediaError {
  return new MediaError("VIDEO_TENSOR_INVALID", message);
}

function checkedMul(a: bigint, b: bigint): bigint | null {
  const product = a * b;
  return product > U64_MAX ? null : product;
}

/**
 * Validates a contiguous [T, H, W, 3] uint8 payload and returns its
 * dimensions, with the reference's checks and messages.
 */
export function videoDimensionsFromParts(info: MediaTensorInfo, bytes: Uint8Array): VideoDimensions {
  const shape = info.shape;
  if (shape.length !== 4) {
    throw invalid(`decoded video shape must be [T, H, W, C], got [${shape.join(", ")}]`);
  }
  const [frames, height, width, channels] = shape as [number, number, number, number];
  if (!(frames > 0)) throw invalid("decoded video has no frames");
  if (!(height > 0 && width > 0)) throw invalid("decoded video dimensions are zero");
  if (channels !== 3) throw invalid("decoded video must contain RGB frames");
  if (info.dtype !== "UINT8") throw invalid("decoded video dtype must be uint8");

  const h = BigInt(height);
  const w = BigInt(width);
  const wh = checkedMul(h, w);
  const frameLen = wh === null ? null : checkedMul(wh, BigInt(channels));
  if (frameLen === null) throw invalid("decoded video frame size overflow");
  const expected = checkedMul(BigInt(frames), frameLen);
  if (expected === null) throw invalid("decoded video payload size overflow");
  if (BigInt(bytes.length) !== expected) {
    throw invalid(`decoded video payload has ${bytes.length} bytes, expected ${expected}`);
  }
  if (w > U32_MAX) throw invalid("decoded video width exceeds u32");
  if (h > U32_MAX) throw invalid("decoded video height exceeds u32");
  return { frames, width, height };
}

/** Checks that video metadata holds only values the wire format can carry. */
export function validateVideoMetadata(metadata: VideoMetadata): void {
  const longest = Math.max(metadata.sampled_timestamps.length, metadata.frames_indices?.length ?? 0);
  if (longest > MAX_VIDEO_FRAMES) {
    throw new MediaError(
      "VIDEO_METADATA_INVALID",
      `video metadata lists ${longest} frames, more than the limit of ${MAX_VIDEO_FRAMES}`,
      BigInt(MAX_VIDEO_FRAMES),
      BigInt(longest),
    );
  }
  const floats = [metadata.source_fps, metadata.source_duration, ...metadata.sampled_timestamps];
  if (!floats.every(Number.isFinite)) {
    throw new MediaError("VIDEO_METADATA_INVALID", "video metadata must hold finite numbers");
  }
  const ints = [
    ...(metadata.source_total_frames === undefined ? [] : [metadata.source_total_frames]),
    ...(metadata.frames_indices ?? []),
  ];
  if (!ints.every(Number.isSafeInteger)) {
    throw new MediaError("VIDEO_METADATA_INVALID", "video frame counts and indices must be integers");
  }
}
