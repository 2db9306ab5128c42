import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  DataType as DataTypePb,
  TensorInfoSchema,
  type TensorInfo,
  type VideoMetadata as VideoMetadataPb,
  type VideoMetadataSchema,
} from "../../gen/mmgate/media/v1/media_pb.js";
import { MediaError } from "./errors.js";
import type { DataType, MediaTensorInfo, VideoMetadata } from "./tensor.js";
import { MAX_TENSOR_RANK } from "./tensor.js";

/** Proto shape (uint64) to numbers; dimensions beyond 2^53 are refused. */
export function shapeFromProto(shape: readonly bigint[]): number[] {
  if (shape.length > MAX_TENSOR_RANK) {
    throw new MediaError(
      "TENSOR_INVALID",
      `tensor rank ${shape.length} exceeds the limit of ${MAX_TENSOR_RANK}`,
      BigInt(MAX_TENSOR_RANK),
      BigInt(shape.length),
    );
  }
  return shape.map((d) => {
    if (d > BigInt(Number.MAX_SAFE_INTEGER)) throw new MediaError("TENSOR_INVALID", `tensor dimension ${d} is too large`);
    return Number(d);
  });
}

export function dtypeFromProto(dtype: DataTypePb): DataType {
  if (dtype === DataTypePb.UNSPECIFIED || dtype === DataTypePb.UINT8) return "UINT8";
  throw new MediaError("TENSOR_INVALID", `unsupported dtype ${dtype}; only UINT8 is supported`);
}

function i64(value: bigint): number {
  if (value > BigInt(Number.MAX_SAFE_INTEGER) || value < BigInt(Number.MIN_SAFE_INTEGER)) {
    throw new MediaError("VIDEO_METADATA_INVALID", `video metadata integer ${value} is out of range`);
  }
  return Number(value);
}

export function videoMetadataFromProto(m: VideoMetadataPb): VideoMetadata {
  return {
    source_fps: m.sourceFps,
    source_duration: m.sourceDuration,
    sampled_timestamps: [...m.sampledTimestamps],
    ...(m.sourceTotalFrames !== undefined ? { source_total_frames: i64(m.sourceTotalFrames) } : {}),
    ...(m.framesIndices !== undefined ? { frames_indices: m.framesIndices.values.map(i64) } : {}),
  };
}

function videoMetadataToProto(m: VideoMetadata): MessageInitShape<typeof VideoMetadataSchema> {
  return {
    sourceFps: m.source_fps,
    sourceDuration: m.source_duration,
    sampledTimestamps: [...m.sampled_timestamps],
    ...(m.source_total_frames !== undefined ? { sourceTotalFrames: BigInt(m.source_total_frames) } : {}),
    ...(m.frames_indices !== undefined ? { framesIndices: { values: m.frames_indices.map((v) => BigInt(v)) } } : {}),
  };
}

export function tensorInfoToProto(info: MediaTensorInfo): TensorInfo {
  const m = info.metadata;
  let metadata: MessageInitShape<typeof TensorInfoSchema>["metadata"] = { case: undefined };
  if (m !== null && "Image" in m) {
    metadata = { case: "image", value: { format: m.Image.format ?? "", colorType: m.Image.color_type, layout: m.Image.layout } };
  } else if (m !== null && "Video" in m) {
    metadata = { case: "video", value: videoMetadataToProto(m.Video) };
  }
  return create(TensorInfoSchema, {
    shape: info.shape.map((d) => BigInt(d)),
    dtype: DataTypePb.UINT8,
    metadata,
  });
}
