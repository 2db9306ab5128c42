import type { VideoMetadata } from "./tensor.js";

/**
 * Formats a finite f64 as serde_json does (shortest round-trip digits laid
 * out by ryu's rules): integers keep a trailing ".0", plain notation for
 * magnitudes in [1e-5, 1e16), otherwise "1e16" / "1.5e-7" style exponents.
 * Non-finite values serialize as null, as serde_json writes them.
 */
export function formatF64(value: number): string {
  if (!Number.isFinite(value)) return "null";
  if (value === 0) return Object.is(value, -0) ? "-0.0" : "0.0";
  const sign = value < 0 ? "-" : "";
  // toExponential() without an argument yields the shortest digits that
  // round-trip, the same digits ryu picks.
  const [mantissa = "", exponent = "0"] = Math.abs(value).toExponential().split("e");
  const digits = mantissa.replace(".", "");
  const length = digits.length;
  const kk = Number(exponent) + 1; // 10^(kk-1) <= |v| < 10^kk
  const k = kk - length;
  let body: string;
  if (k >= 0 && kk <= 16) body = `${digits}${"0".repeat(k)}.0`;
  else if (kk > 0 && kk <= 16) body = `${digits.slice(0, kk)}.${digits.slice(kk)}`;
  else if (kk > -5 && kk <= 0) body = `0.${"0".repeat(-kk)}${digits}`;
  else if (length === 1) body = `${digits}e${kk - 1}`;
  else body = `${digits.slice(0, 1)}.${digits.slice(1)}e${kk - 1}`;
  return sign + body;
}

function formatI64(value: number): string {
  return BigInt(value).toString();
}

/**
 * The reference's serde_json bytes of VideoMetadata: fields in declaration
 * order, no whitespace; the two optional fields only when present.
 */
export function videoMetadataJson(metadata: VideoMetadata): string {
  let out = `{"source_fps":${formatF64(metadata.source_fps)}`;
  out += `,"source_duration":${formatF64(metadata.source_duration)}`;
  out += `,"sampled_timestamps":[${metadata.sampled_timestamps.map(formatF64).join(",")}]`;
  if (metadata.source_total_frames !== undefined) {
    out += `,"source_total_frames":${formatI64(metadata.source_total_frames)}`;
  }
  if (metadata.frames_indices !== undefined) {
    out += `,"frames_indices":[${metadata.frames_indices.map(formatI64).join(",")}]`;
  }
  return out + "}";
}
