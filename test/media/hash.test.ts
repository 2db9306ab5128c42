import { expect } from "chai";
import { xxh3 } from "@node-rs/xxhash";
import {
  canonicalContentHash,
  contentHashForTensor,
  formatContentHashKey,
  ONE_SHOT_MAX_BYTES,
  parseContentHashKey,
  videoContentHash,
} from "../../src/media/hash.js";
import { formatF64, videoMetadataJson } from "../../src/media/serde-json.js";
import { videoDimensionsFromParts } from "../../src/media/video.js";
import type { MediaTensorInfo, VideoMetadata } from "../../src/media/tensor.js";
import { MAX_TENSOR_RANK } from "../../src/media/tensor.js";
import { MediaError } from "../../src/media/errors.js";

function u64le(v: number | bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt(v));
  return b;
}

/** The image rule written out independently of the implementation. */
function imageRule(shape: number[], bytes: Uint8Array): bigint {
  const parts = [u64le(shape.length), ...shape.map(u64le), Buffer.of(0), Buffer.from(bytes)];
  return xxh3.xxh64(Buffer.concat(parts), 0n);
}

function lp(b: Uint8Array): Buffer {
  return Buffer.concat([u64le(b.length), Buffer.from(b)]);
}

function videoRule(shape: number[], json: string, bytes: Uint8Array): bigint {
  const parts = [lp(Buffer.from("video")), u64le(shape.length), ...shape.map(u64le), Buffer.of(0), lp(Buffer.from(json)), lp(bytes)];
  return xxh3.xxh64(Buffer.concat(parts), 0n);
}

const VIDEO_BYTES = Uint8Array.from({ length: 12 }, (_, i) => i);

function videoInfo(sampled: number[], extra: Partial<VideoMetadata> = {}): MediaTensorInfo {
  return {
    shape: [2, 1, 2, 3],
    dtype: "UINT8",
    metadata: { Video: { source_fps: 24.0, source_duration: 10.0, sampled_timestamps: sampled, ...extra } },
  };
}

describe("media content hash", () => {
  it("matches the reference's golden vector for shape [1,2,3] and bytes 00..05", () => {
    const hash = canonicalContentHash([1, 2, 3], "UINT8", Uint8Array.of(0, 1, 2, 3, 4, 5));
    expect(hash).to.equal(0x7a9bbcb11a898630n);
    expect(formatContentHashKey(hash!)).to.equal("7a9bbcb11a898630");
  });

  it("has no hash for an empty payload", () => {
    expect(canonicalContentHash([0, 0, 3], "UINT8", new Uint8Array(0))).to.equal(null);
    const info: MediaTensorInfo = { shape: [0], dtype: "UINT8", metadata: { Image: { format: "Png", color_type: "Rgb8", layout: "HWC" } } };
    expect(contentHashForTensor(info, new Uint8Array(0), true)).to.equal(null);
  });

  it("agrees between the one-shot and the streaming path on both sides of the threshold", () => {
    // A rank-3 header is 33 bytes: payloads of threshold-34 and threshold-33
    // bytes sit just under and exactly at the threshold.
    for (const size of [1, ONE_SHOT_MAX_BYTES - 34, ONE_SHOT_MAX_BYTES - 33, ONE_SHOT_MAX_BYTES, 4096, 1 << 20]) {
      const bytes = Uint8Array.from({ length: size }, (_, i) => (i * 31 + 7) & 0xff);
      const shape = [1, size, 1];
      expect(canonicalContentHash(shape, "UINT8", bytes), `size ${size}`).to.equal(imageRule(shape, bytes));
    }
  });

  it("accepts byte views at an offset without copying them", () => {
    const backing = Uint8Array.from({ length: 5000 }, (_, i) => i & 0xff);
    const view = backing.subarray(7, 4007);
    expect(canonicalContentHash([4000], "UINT8", view)).to.equal(imageRule([4000], backing.slice(7, 4007)));
  });

  it("refuses tensors of more than MAX_TENSOR_RANK dimensions before building anything", () => {
    expect(canonicalContentHash(Array(MAX_TENSOR_RANK).fill(1), "UINT8", Uint8Array.of(7))).to.be.a("bigint");
    expect(() => canonicalContentHash(Array(MAX_TENSOR_RANK + 1).fill(1), "UINT8", Uint8Array.of(7)))
      .to.throw(MediaError, `tensor rank ${MAX_TENSOR_RANK + 1} exceeds the limit of ${MAX_TENSOR_RANK}`);
  });

  it("formats keys as 16 zero-padded lowercase hex digits and parses them back", () => {
    for (const v of [0n, 1n, 0xabcn, 0x7a9bbcb11a898630n, (1n << 64n) - 1n]) {
      const key = formatContentHashKey(v);
      expect(key).to.have.length(16);
      expect(key).to.match(/^[0-9a-f]{16}$/);
      expect(parseContentHashKey(key)).to.equal(v);
    }
    expect(parseContentHashKey("xyz")).to.equal(null);
    expect(parseContentHashKey("00000000000000000")).to.equal(null);
  });
});

describe("serde_json float and video metadata formatting", () => {
  const table: [number, string][] = [
    [24, "24.0"], [10, "10.0"], [0, "0.0"], [-0, "-0.0"], [5.1, "5.1"], [0.1, "0.1"], [1 / 3, "0.3333333333333333"],
    [29.97002997002997, "29.97002997002997"], [1e15, "1000000000000000.0"], [1e16, "1e16"], [1.5e16, "1.5e16"],
    [123456789012345680000, "1.2345678901234568e20"], [0.0001, "0.0001"], [0.00001, "0.00001"], [0.000001, "1e-6"],
    [1.5e-7, "1.5e-7"], [-2.5, "-2.5"], [Number.MAX_VALUE, "1.7976931348623157e308"], [5e-324, "5e-324"],
    [Number.NaN, "null"], [Number.POSITIVE_INFINITY, "null"],
  ];
  for (const [value, text] of table) {
    it(`formats ${value} as ${text}`, () => expect(formatF64(value)).to.equal(text));
  }

  it("serializes the seed's three fields in declaration order", () => {
    expect(videoMetadataJson({ source_fps: 24, source_duration: 10, sampled_timestamps: [0, 5] })).to.equal(
      '{"source_fps":24.0,"source_duration":10.0,"sampled_timestamps":[0.0,5.0]}',
    );
  });

  it("adds the two optional fields only when present", () => {
    expect(
      videoMetadataJson({ source_fps: 30, source_duration: 2.5, sampled_timestamps: [0, 1.2], source_total_frames: 75, frames_indices: [0, 36] }),
    ).to.equal('{"source_fps":30.0,"source_duration":2.5,"sampled_timestamps":[0.0,1.2],"source_total_frames":75,"frames_indices":[0,36]}');
  });
});

describe("video content hash (seed cases)", () => {
  it("covers metadata, shape and RGB bytes", () => {
    const info = videoInfo([0.0, 5.0]);
    const expected = videoContentHash(info, VIDEO_BYTES);
    expect(videoContentHash(info, VIDEO_BYTES)).to.equal(expected);
    expect(expected).to.equal(
      videoRule([2, 1, 2, 3], '{"source_fps":24.0,"source_duration":10.0,"sampled_timestamps":[0.0,5.0]}', VIDEO_BYTES),
    );
    expect(videoContentHash(videoInfo([0.0, 5.1]), VIDEO_BYTES)).not.to.equal(expected);
    expect(videoContentHash({ ...info, shape: [1, 2, 2, 3] }, VIDEO_BYTES)).not.to.equal(expected);
    const changed = VIDEO_BYTES.slice();
    changed[0] = 42;
    expect(videoContentHash(info, changed)).not.to.equal(expected);
  });

  it("pins the seed-shaped vectors (regression keys computed from the rule)", () => {
    expect(formatContentHashKey(videoContentHash(videoInfo([0.0, 5.0]), VIDEO_BYTES))).to.equal("7e4b54c46acd410c");
    const five = videoInfo([0.0, 5.0], { source_total_frames: 240, frames_indices: [0, 120] });
    expect(formatContentHashKey(videoContentHash(five, VIDEO_BYTES))).to.equal("673960f3e4288e55");
  });

  it("includes the optional fields in the identity when present", () => {
    const base = videoContentHash(videoInfo([0, 5]), VIDEO_BYTES);
    const withFrames = videoContentHash(videoInfo([0, 5], { source_total_frames: 240, frames_indices: [0, 120] }), VIDEO_BYTES);
    expect(withFrames).not.to.equal(base);
  });

  it("is precomputed from decoded storage when exact routing is eligible", () => {
    const info = videoInfo([0.0, 5.0]);
    expect(contentHashForTensor(info, VIDEO_BYTES, true)).to.equal(videoContentHash(info, VIDEO_BYTES));
  });

  it("is skipped when exact routing is ineligible", () => {
    expect(contentHashForTensor(videoInfo([0.0, 5.0]), VIDEO_BYTES, false)).to.equal(null);
  });

  it("is skipped for tensors without metadata", () => {
    expect(contentHashForTensor({ shape: [2, 1, 2, 3], dtype: "UINT8", metadata: null }, VIDEO_BYTES, true)).to.equal(null);
  });

  it("validates the RGB payload layout", () => {
    const info = videoInfo([0.0, 5.0]);
    expect(videoDimensionsFromParts(info, VIDEO_BYTES)).to.deep.equal({ frames: 2, width: 2, height: 1 });
    const cases: [MediaTensorInfo, Uint8Array, string][] = [
      [{ ...info, shape: [2, 1, 2, 4] }, VIDEO_BYTES, "decoded video must contain RGB frames"],
      [info, VIDEO_BYTES.subarray(0, 11), "decoded video payload has 11 bytes, expected 12"],
      [{ ...info, shape: [1, 2, 3] }, VIDEO_BYTES, "decoded video shape must be [T, H, W, C], got [1, 2, 3]"],
      [{ ...info, shape: [0, 1, 2, 3] }, VIDEO_BYTES, "decoded video has no frames"],
      [{ ...info, shape: [2, 0, 2, 3] }, VIDEO_BYTES, "decoded video dimensions are zero"],
      [{ ...info, shape: [2, 2 ** 40, 2 ** 40, 3] }, VIDEO_BYTES, "decoded video frame size overflow"],
      [{ ...info, shape: [2 ** 30, 2 ** 20, 2 ** 20, 3] }, VIDEO_BYTES, "decoded video payload size overflow"],
    ];
    for (const [badInfo, bytes, message] of cases) {
      expect(() => videoDimensionsFromParts(badInfo, bytes)).to.throw(MediaError, message);
    }
  });
});
