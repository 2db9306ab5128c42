import type { ImageFormat } from "./tensor.js";

function startsWith(bytes: Uint8Array, magic: readonly number[], at = 0): boolean {
  if (bytes.length < at + magic.length) return false;
  return magic.every((b, i) => bytes[at + i] === b);
}

const ascii = (s: string): number[] => Array.from(s, (c) => c.charCodeAt(0));

/**
 * Sniffs the container format from its magic bytes, as the reference does
 * before choosing a decoder. Null when the bytes match no known format.
 */
export function guessImageFormat(bytes: Uint8Array): ImageFormat | null {
  if (startsWith(bytes, [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])) return "Png";
  if (startsWith(bytes, [0xff, 0xd8, 0xff])) return "Jpeg";
  if (startsWith(bytes, ascii("GIF87a")) || startsWith(bytes, ascii("GIF89a"))) return "Gif";
  if (startsWith(bytes, ascii("RIFF")) && startsWith(bytes, ascii("WEBP"), 8)) return "WebP";
  if (startsWith(bytes, [0x49, 0x49, 0x2a, 0x00]) || startsWith(bytes, [0x4d, 0x4d, 0x00, 0x2a])) return "Tiff";
  if (startsWith(bytes, ascii("ftyp"), 4) && (startsWith(bytes, ascii("avif"), 8) || startsWith(bytes, ascii("avis"), 8))) {
    return "Avif";
  }
  if (startsWith(bytes, ascii("BM"))) return "Bmp";
  return null;
}

/**
 * Formats this build decodes: BMP with mmgate's own decoder (sharp's
 * prebuilt libvips has no BMP loader), the others with sharp.
 */
export const DECODABLE_FORMATS: ReadonlySet<ImageFormat> = new Set(["Png", "Jpeg", "Gif", "WebP", "Tiff", "Avif", "Bmp"]);
