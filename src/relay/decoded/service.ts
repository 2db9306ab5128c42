/**
 * `mmgate.kvrelay.v1.Cbi1Service` (decode and encode single frames) and
 * `DecodedRelayService` (a relay pool stream with each payload decoded).
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { FilterUpdateKind, type FilterUpdate, type KvEventRelay } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import {
  Cbi1ErrorDetailSchema,
  DecodeResponseSchema,
  EncodeResponseSchema,
  SubscribeKvPoolDecodedResponseSchema,
  type Cbi1Service,
  type DecodedRelayService,
  type SubscribeKvPoolDecodedResponse,
} from "../../../gen/mmgate/kvrelay/v1/cbi1_pb.js";
import { Cbi1Error, FilterFormat } from "../cbi1/index.js";
import { RelayError } from "../wire/index.js";
import { frameFromProto, frameToProto } from "./frame-proto.js";

/** A frame the codec refused: INVALID_ARGUMENT with the codec's code in a Cbi1ErrorDetail. */
export function cbi1ErrorToConnect(error: Cbi1Error): ConnectError {
  const detail = create(Cbi1ErrorDetailSchema, { code: error.code, message: error.message });
  return new ConnectError(`${error.code}: ${error.message}`, Code.InvalidArgument, undefined, [{ desc: Cbi1ErrorDetailSchema, value: detail }], error);
}

export function cbi1Service(): Partial<ServiceImpl<typeof Cbi1Service>> {
  return {
    decode(req) {
      const expected = req.expectedFormat;
      const format = expected === undefined ? undefined : formatOf(expected.seed, expected.bucketCount);
      return create(DecodeResponseSchema, { frame: frameToProto(req.frame, { format, sparse: req.sparse }) });
    },
    encode(req) {
      if (req.frame === undefined) throw new Cbi1Error("InvalidArgument", "frame is required");
      return create(EncodeResponseSchema, { frame: frameFromProto(req.frame) });
    },
  };
}

function formatOf(seed: bigint, bucketCount: bigint): FilterFormat {
  if (bucketCount > BigInt(Number.MAX_SAFE_INTEGER)) throw new Cbi1Error("Format", `bucket_count ${bucketCount} is not a power of two in range`);
  return new FilterFormat(seed, Number(bucketCount));
}

/**
 * The decoded pool stream over the relay's own SubscribeKvPool handler: the
 * same validation, limits, ordering, heartbeats and errors, since it is the
 * same code; each payload decoded against the producer's format.
 */
export function decodedRelayService(relay: Partial<ServiceImpl<typeof KvEventRelay>>): Partial<ServiceImpl<typeof DecodedRelayService>> {
  const subscribe = relay.subscribeKvPool;
  if (subscribe === undefined) throw new Error("the relay service has no SubscribeKvPool handler");
  return {
    async *subscribeKvPoolDecoded(req, ctx) {
      if (req.request === undefined) throw new RelayError("INVALID_REQUEST", "request is required");
      let format: FilterFormat | undefined;
      for await (const init of subscribe(req.request, ctx)) {
        // The relay's handler yields whole FilterUpdate messages (its type only promises an init shape).
        const update = init as FilterUpdate;
        const decoded: SubscribeKvPoolDecodedResponse = create(SubscribeKvPoolDecodedResponseSchema, {
          protocolVersion: update.protocolVersion,
          relay: update.relay,
          producer: update.producer,
          baseSequence: update.baseSequence,
          sequence: update.sequence,
          sendTsUs: update.sendTsUs,
          kind: update.kind,
          contractMarker: update.contractMarker,
        });
        if (update.kind !== FilterUpdateKind.HEARTBEAT) {
          const ckf = update.producer?.ckfFormat;
          if (ckf !== undefined) format ??= formatOf(ckf.seed, ckf.bucketCount);
          // The relay's own frame: a refusal here is the relay's bug, not the client's.
          try {
            decoded.frame = frameToProto(update.payload, { format, sparse: req.sparse });
          } catch (error) {
            throw new RelayError("INTERNAL", `the relay's own frame did not decode: ${(error as Error).message}`, { cause: error });
          }
        }
        yield decoded;
      }
    },
  };
}
