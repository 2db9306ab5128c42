import type { JsonReadOptions, JsonWriteOptions } from "@bufbuild/protobuf";

/**
 * The JSON options of every request path (connect's handlers for Connect,
 * gRPC+json and gRPC-Web+json, and the lean path's Connect unary calls):
 * protobuf JSON as `buf curl` and Go's protojson read it. connect-es
 * ignores unknown fields by default (and, with them, unknown enum names,
 * which then leave the field at its default); here both are refused, as
 * INVALID_ARGUMENT naming the key or the enum and value, so that a typo
 * such as `"parametrs"` or `"outputFormat":"webp"` is not silently dropped
 * on a call that spends quota.
 */
export const jsonOptions: Partial<JsonReadOptions & JsonWriteOptions> = Object.freeze({ ignoreUnknownFields: false });
