import { readFile } from "node:fs/promises";
import { fromBinary } from "@bufbuild/protobuf";
import type { FileDescriptorProto } from "@bufbuild/protobuf/wkt";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import { rootUrl } from "../paths.js";

/**
 * The buf image `npm run generate` writes next to the stubs (`buf build
 * --exclude-imports`): every file of proto/ with its source_code_info, which
 * the descriptors embedded in the stubs leave out. Reflection serves these so
 * that `grpcurl describe` and similar tools show the schema's comments.
 */
export const descriptorImageUrl = new URL("gen/descriptors.binpb", rootUrl);

export type DescriptorImage = ReadonlyMap<string, FileDescriptorProto>;

/**
 * The files of a buf image by name. A buf image is wire-compatible with a
 * FileDescriptorSet; its files carry buf's own bookkeeping as an unknown
 * field (8042), dropped here because clients have no use for it. Unknown
 * fields deeper down (custom option values) stay.
 */
export function parseDescriptorImage(bytes: Uint8Array): Map<string, FileDescriptorProto> {
  const files = new Map<string, FileDescriptorProto>();
  for (const file of fromBinary(FileDescriptorSetSchema, bytes).file) {
    delete file.$unknown;
    files.set(file.name, file);
  }
  return files;
}

let loaded: Promise<DescriptorImage> | undefined;

/**
 * Reads the image once per process, on first use rather than at import, so
 * commands that never answer reflection do not pay for it. An image that
 * cannot be read is an empty one: reflection then serves the embedded
 * descriptors, correct but without comments, and says so once.
 */
export function loadDescriptorImage(): Promise<DescriptorImage> {
  loaded ??= readFile(descriptorImageUrl)
    .then(parseDescriptorImage)
    .catch((err: unknown) => {
      process.emitWarning(
        `reflection serves descriptors without comments: cannot read ${descriptorImageUrl.pathname} (${(err as Error).message}); run \`npm run generate\``,
        "MmgateWarning",
      );
      return new Map<string, FileDescriptorProto>();
    });
  return loaded;
}
