export {
  ByteRangeError,
  ByteReaderError,
  ByteWriterError,
  U64_MAX,
  type BytePosition,
  type ByteReaderErrorCode,
  type ByteWriterErrorCode,
} from "./errors.js";
export { ByteReader, type ByteReaderOptions } from "./reader.js";
export { ByteWriter, lengthPrefixedSize } from "./writer.js";
export { ONE_SHOT_MAX_BYTES, XXH3_IMPLEMENTATION, xxh3_64, xxh3_64Parts, xxh3Low32, Xxh3Stream } from "./xxh3.js";
