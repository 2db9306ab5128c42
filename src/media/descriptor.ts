import { randomUUID } from "node:crypto";
import * as pako from "pako";
import { formatContentHashKey } from "./hash.js";
import { videoMetadataJson } from "./serde-json.js";
import type { DecodedMediaMetadata, MediaTensorInfo } from "./tensor.js";
import { isImageMetadata } from "./tensor.js";

export type MemType = "Dram" | "Vram" | "Block" | "Object" | "File" | "Unknown";

/** Where the bytes are: here, a tensor store handle and its byte length. */
export interface NixlDescriptor {
  readonly addr: bigint;
  readonly size: number;
  readonly mem_type: MemType;
  readonly device_id: bigint;
}

/** The reference's RdmaMediaDataDescriptor with tensor info flattened in. */
export interface MediaDataDescriptor {
  readonly nixl_metadata: string;
  readonly nixl_descriptor: NixlDescriptor;
  readonly tensor_info: MediaTensorInfo;
  /** 16 lowercase hex digits; omitted from the JSON when null. */
  readonly content_hash: string | null;
}

/** The transfer agent: a tensor store reachable at an endpoint. */
export interface TransferAgent {
  readonly name: string;
  readonly endpoint: string;
}

const AGENT_BACKEND = "mmgate-tensor-store";
const AGENT_SERVICE = "mmgate.media.v1.MediaService";

export function newTransferAgent(endpoint: string): TransferAgent {
  return { name: `media-loader-${randomUUID()}`, endpoint };
}

/** The agent's local metadata: what a receiver needs to reach the store. */
export function agentMetadataBytes(agent: TransferAgent): Uint8Array {
  return new TextEncoder().encode(
    JSON.stringify({ name: agent.name, backend: AGENT_BACKEND, endpoint: agent.endpoint, service: AGENT_SERVICE }),
  );
}

/** "b64:" + standard padded base64 of zlib (RFC 1950, level 6). */
export function encodeNixlMetadata(metadata: Uint8Array): string {
  const compressed = pako.deflate(metadata, { level: 6 });
  return `b64:${Buffer.from(compressed.buffer, compressed.byteOffset, compressed.length).toString("base64")}`;
}

/** Inverse of encodeNixlMetadata; throws on a missing prefix or bad data. */
export function decodeNixlMetadata(encoded: string): Uint8Array {
  if (!encoded.startsWith("b64:")) throw new Error('nixl_metadata must start with "b64:"');
  const body = encoded.slice(4);
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(body) || body.length % 4 !== 0) throw new Error("nixl_metadata is not base64");
  return pako.inflate(Buffer.from(body, "base64"));
}

/** The reference's serde JSON of decoded-media metadata (externally tagged). */
export function metadataJson(metadata: DecodedMediaMetadata | null): string {
  if (metadata === null) return "null";
  if (isImageMetadata(metadata)) {
    const m = metadata.Image;
    return `{"Image":{"format":${JSON.stringify(m.format)},"color_type":${JSON.stringify(m.color_type)},"layout":"HWC"}}`;
  }
  return `{"Video":${videoMetadataJson(metadata.Video)}}`;
}

/** Serializes a descriptor as the reference does (field order, u64 exact). */
export function descriptorToJson(d: MediaDataDescriptor): string {
  const n = d.nixl_descriptor;
  let out = `{"nixl_metadata":${JSON.stringify(d.nixl_metadata)}`;
  out += `,"nixl_descriptor":{"addr":${n.addr},"size":${n.size},"mem_type":${JSON.stringify(n.mem_type)},"device_id":${n.device_id}}`;
  out += `,"shape":[${d.tensor_info.shape.join(",")}],"dtype":${JSON.stringify(d.tensor_info.dtype)}`;
  out += `,"metadata":${metadataJson(d.tensor_info.metadata)}`;
  if (d.content_hash !== null) out += `,"content_hash":${JSON.stringify(d.content_hash)}`;
  return out + "}";
}

/** Builds the descriptor of a stored tensor. */
export function buildDescriptor(
  nixlMetadata: string,
  handle: bigint,
  size: number,
  tensorInfo: MediaTensorInfo,
  contentHash: bigint | null,
): MediaDataDescriptor {
  return {
    nixl_metadata: nixlMetadata,
    nixl_descriptor: { addr: handle, size, mem_type: "Dram", device_id: 0n },
    tensor_info: tensorInfo,
    content_hash: contentHash === null ? null : formatContentHashKey(contentHash),
  };
}

function fail(what: string): never {
  throw new Error(`invalid media descriptor: ${what}`);
}

function u64(value: unknown, what: string): bigint {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) fail(what);
  return BigInt(value);
}

/**
 * Parses descriptor JSON (as written by descriptorToJson). u64 fields must
 * be exact in a double, which holds for every handle this store issues.
 */
export function parseDescriptorJson(json: string): MediaDataDescriptor {
  const raw = JSON.parse(json) as Record<string, unknown>;
  const nixl = raw["nixl_descriptor"] as Record<string, unknown> | undefined;
  if (typeof raw["nixl_metadata"] !== "string") fail("nixl_metadata");
  if (nixl === undefined || typeof nixl !== "object") fail("nixl_descriptor");
  const shape = raw["shape"];
  if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) fail("shape");
  if (raw["dtype"] !== "UINT8") fail("dtype");
  const hash = raw["content_hash"];
  if (hash !== undefined && (typeof hash !== "string" || !/^[0-9a-f]{16}$/.test(hash))) fail("content_hash");
  return {
    nixl_metadata: raw["nixl_metadata"],
    nixl_descriptor: {
      addr: u64(nixl["addr"], "addr"),
      size: Number(u64(nixl["size"], "size")),
      mem_type: nixl["mem_type"] as MemType,
      device_id: u64(nixl["device_id"], "device_id"),
    },
    tensor_info: { shape: shape as number[], dtype: "UINT8", metadata: (raw["metadata"] ?? null) as DecodedMediaMetadata | null },
    content_hash: hash ?? null,
  };
}
