/**
 * Helpers for the readiness, topology and router tests: the relay's
 * readiness and catalog streams and the router's Overlap read over both
 * client stacks, connect-node and @grpc/grpc-js. The grpc-js client is a
 * generic one whose messages are (de)serialized with the generated
 * protobuf-es schemas, so the test reads exactly what the wire carried and
 * can hand it to the contract's validators.
 */
import { create, fromBinary, toBinary, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import {
  KvEventRelay,
  KvPoolCatalogUpdateSchema,
  ServingReadinessUpdateSchema,
  SubscribeServingReadinessRequestSchema,
  WatchKvPoolCatalogRequestSchema,
  type KvPoolCatalogUpdate,
  type ServingReadinessUpdate,
} from "../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { OverlapRequestSchema, OverlapResponseSchema, OverlapService, type OverlapResponse } from "../../gen/mmgate/kvrouter/v1/kvrouter_pb.js";
import { RELAY_CONTRACT_MARKER } from "../../src/relay/index.js";
import { cancelledOnExit } from "../../src/util/index.js";
import type { TestServer } from "../support/index.js";

export type ClientStack = "connect" | "grpc-js";
export const CLIENT_STACKS: readonly ClientStack[] = ["connect", "grpc-js"];

const MAX_MESSAGE = 8 * 1024 * 1024;

function method<I extends DescMessage, O extends DescMessage>(path: string, input: I, output: O, responseStream: boolean): grpc.MethodDefinition<MessageShape<I>, MessageShape<O>> {
  return {
    path,
    requestStream: false,
    responseStream,
    requestSerialize: (message: MessageShape<I>) => Buffer.from(toBinary(input, message)),
    requestDeserialize: (bytes: Buffer) => fromBinary(input, bytes),
    responseSerialize: (message: MessageShape<O>) => Buffer.from(toBinary(output, message)),
    responseDeserialize: (bytes: Buffer) => fromBinary(output, bytes),
  };
}

const RelayClient = grpc.makeGenericClientConstructor(
  {
    subscribeServingReadiness: method("/dynamo.kvrelay.v1.KvEventRelay/SubscribeServingReadiness", SubscribeServingReadinessRequestSchema, ServingReadinessUpdateSchema, true),
    watchKvPoolCatalog: method("/dynamo.kvrelay.v1.KvEventRelay/WatchKvPoolCatalog", WatchKvPoolCatalogRequestSchema, KvPoolCatalogUpdateSchema, true),
  },
  "KvEventRelay",
);

const RouterClient = grpc.makeGenericClientConstructor(
  { overlap: method("/mmgate.kvrouter.v1.OverlapService/Overlap", OverlapRequestSchema, OverlapResponseSchema, false) },
  "OverlapService",
);

/** The first `count` messages of a grpc-js server stream (then cancelled). */
function grpcJsFirst<T>(call: grpc.ClientReadableStream<T>, count: number): Promise<T[]> {
  const received: T[] = [];
  return new Promise((resolve, reject) => {
    call.on("data", (message: T) => {
      received.push(message);
      if (received.length === count) {
        call.cancel();
        resolve(received);
      }
    });
    call.on("error", (error: grpc.ServiceError) => {
      if (error.code !== grpc.status.CANCELLED) reject(error);
    });
    call.on("end", () => reject(new Error(`the stream ended after ${received.length} of ${count} messages`)));
  });
}

/** The first `count` messages of a connect server stream, then cancelled (a break alone would leave the call open). */
async function connectFirst<T>(open: (signal: AbortSignal) => AsyncIterable<T>, count: number): Promise<T[]> {
  const received: T[] = [];
  for await (const message of cancelledOnExit(undefined, open)) {
    received.push(message);
    if (received.length === count) break;
  }
  return received;
}

export async function readinessNow(server: TestServer, stack: ClientStack): Promise<ServingReadinessUpdate> {
  const request = { subscriberId: `readiness-${stack}`, contractMarker: RELAY_CONTRACT_MARKER };
  if (stack === "connect") return (await connectFirst((signal) => createClient(KvEventRelay, server.transport).subscribeServingReadiness(request, { signal }), 1))[0]!;
  const client = new RelayClient(server.addr, grpc.credentials.createInsecure(), { "grpc.max_receive_message_length": MAX_MESSAGE });
  try {
    const call = (client as unknown as Record<string, (r: unknown) => grpc.ClientReadableStream<ServingReadinessUpdate>>)["subscribeServingReadiness"]!(
      create(SubscribeServingReadinessRequestSchema, request),
    );
    return (await grpcJsFirst(call, 1))[0]!;
  } finally {
    client.close();
  }
}

/** A catalog stream over `stack`: `next()` is its next update. */
export function catalogStream(server: TestServer, stack: ClientStack): { next(): Promise<KvPoolCatalogUpdate>; close(): void } {
  const request = { subscriberId: `catalog-${stack}`, contractMarker: RELAY_CONTRACT_MARKER };
  const queue: KvPoolCatalogUpdate[] = [];
  const waiters: { resolve(u: KvPoolCatalogUpdate): void; reject(e: unknown): void }[] = [];
  let failure: unknown;
  const push = (update: KvPoolCatalogUpdate) => {
    const waiter = waiters.shift();
    if (waiter !== undefined) waiter.resolve(update);
    else queue.push(update);
  };
  const fail = (error: unknown) => {
    failure = error;
    for (const waiter of waiters.splice(0)) waiter.reject(error);
  };
  let close: () => void;
  if (stack === "connect") {
    const controller = new AbortController();
    void (async () => {
      try {
        for await (const update of createClient(KvEventRelay, server.transport).watchKvPoolCatalog(request, { signal: controller.signal })) push(update);
        fail(new Error("the catalog stream ended"));
      } catch (error) {
        if (!controller.signal.aborted) fail(error);
      }
    })();
    close = () => controller.abort();
  } else {
    const client = new RelayClient(server.addr, grpc.credentials.createInsecure(), { "grpc.max_receive_message_length": MAX_MESSAGE });
    const call = (client as unknown as Record<string, (r: unknown) => grpc.ClientReadableStream<KvPoolCatalogUpdate>>)["watchKvPoolCatalog"]!(create(WatchKvPoolCatalogRequestSchema, request));
    call.on("data", push);
    call.on("error", (error: grpc.ServiceError) => {
      if (error.code !== grpc.status.CANCELLED) fail(error);
    });
    close = () => {
      call.cancel();
      client.close();
    };
  }
  return {
    next() {
      const update = queue.shift();
      if (update !== undefined) return Promise.resolve(update);
      if (failure !== undefined) return Promise.reject(failure instanceof Error ? failure : new Error(String(failure)));
      return new Promise((resolve, reject) => waiters.push({ resolve, reject }));
    },
    close: () => close(),
  };
}

/** The router's Overlap answer over `stack`. */
export async function overlapVia(server: TestServer, stack: ClientStack, tokens: readonly number[], model: string): Promise<OverlapResponse> {
  if (stack === "connect") return createClient(OverlapService, server.transport).overlap({ tokens: [...tokens], model });
  const client = new RouterClient(server.addr, grpc.credentials.createInsecure());
  try {
    return await new Promise<OverlapResponse>((resolve, reject) => {
      (client as unknown as Record<string, (r: unknown, cb: (e: grpc.ServiceError | null, r: OverlapResponse) => void) => void>)["overlap"]!(
        create(OverlapRequestSchema, { tokens: [...tokens], model }),
        (error, response) => (error === null ? resolve(response) : reject(error)),
      );
    });
  } finally {
    client.close();
  }
}
