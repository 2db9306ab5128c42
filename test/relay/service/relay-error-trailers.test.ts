/**
 * C.3: every error of the relay's services carries the
 * `kv-relay-error-reason` trailer, including the statuses the host builds
 * itself: the INTERNAL of an unexpected error, and the UNAVAILABLE of a call
 * refused while the server drains. Read with grpc-js, on the request path
 * the run selects (lean by default, connect with MMGATE_TEST_RPC_PATH=connect).
 */
import * as grpc from "@grpc/grpc-js";
import { Code } from "@connectrpc/connect";
import { expect } from "chai";
import { RELAY_CONTRACT_MARKER } from "../../../src/relay/index.js";
import { connectPathOnly, eventually, grpcServerStream, grpcUnary, startServer, type GrpcClient } from "../../support/index.js";
import { startRelay, type RelayServer } from "./support.js";
import { ShapesService } from "../../support/shapes-service.js";
import { bindService, defineModule } from "../../../src/server/index.js";
import { z } from "zod";

const REASON = "kv-relay-error-reason";

function trailerReason(err: grpc.ServiceError): string | undefined {
  const value = err.metadata?.get(REASON)[0];
  return typeof value === "string" ? value : undefined;
}

async function failureOf(call: Promise<unknown>): Promise<grpc.ServiceError> {
  return call.then(
    () => expect.fail("the call succeeded"),
    (e: unknown) => e as grpc.ServiceError,
  );
}

/** A grpc-js client interceptor that opens the call (headers) but holds its request message until `release`. */
function holdingRequest(): { interceptor: grpc.Interceptor; release: () => void } {
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  const interceptor: grpc.Interceptor = (options, nextCall) =>
    new grpc.InterceptingCall(nextCall(options), {
      sendMessage(message, next) {
        void released.then(() => next(message));
      },
      halfClose(next) {
        void released.then(() => next());
      },
    });
  return { interceptor, release };
}

describe(`relay error trailers (C.3) on the ${connectPathOnly ? "connect" : "lean"} request path`, function () {
  this.timeout(20_000);

  describe("an unexpected error in a relay method", () => {
    let server: RelayServer;
    let client: GrpcClient;
    before(async () => {
      server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64 }] });
      client = server.grpcClient("dynamo/kvrelay/v1/relay.proto", "dynamo.kvrelay.v1.KvEventRelay");
    });
    after(() => server.close());

    it("answers INTERNAL with RELAY_ERROR_REASON_INTERNAL, naming no detail of the error", async () => {
      // What the catalog stream reads first; made to throw what no relay code expects.
      const relay = server.relay as unknown as { currentCatalog: () => unknown };
      const currentCatalog = relay.currentCatalog;
      relay.currentCatalog = () => {
        throw new TypeError("something nobody expected");
      };
      try {
        const err = await failureOf(grpcServerStream(client, "WatchKvPoolCatalog", { subscriberId: "trailers", contractMarker: RELAY_CONTRACT_MARKER }));
        expect(err.code).to.equal(grpc.status.INTERNAL);
        expect(trailerReason(err)).to.equal("RELAY_ERROR_REASON_INTERNAL");
        expect(err.details).to.match(/^internal error/);
        expect(err.details).to.not.include("nobody expected");
      } finally {
        relay.currentCatalog = currentCatalog;
      }
      // The relay still answers afterwards.
      const info = await grpcUnary<{ protocolVersion: number }>(client, "GetRelayInfo", { contractMarker: RELAY_CONTRACT_MARKER });
      expect(info.protocolVersion).to.equal(1);
    });

    it("keeps the relay's own reasons as they were (a contract mismatch)", async () => {
      const err = await failureOf(grpcUnary(client, "GetRelayInfo", { contractMarker: 0 }));
      expect(err.code).to.equal(grpc.status.FAILED_PRECONDITION);
      expect(trailerReason(err)).to.equal("RELAY_ERROR_REASON_CONTRACT_MISMATCH");
    });
  });

  describe("a call refused while the server drains", () => {
    it("answers UNAVAILABLE with RELAY_ERROR_REASON_PUBLICATION_UNAVAILABLE", async () => {
      const server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64 }] });
      let shutdown: Promise<void> | undefined;
      try {
        const client = server.grpcClient("dynamo/kvrelay/v1/relay.proto", "dynamo.kvrelay.v1.KvEventRelay");
        // A warm-up call, so the channel is connected before the held one.
        await grpcUnary(client, "GetRelayInfo", { contractMarker: RELAY_CONTRACT_MARKER });
        const hold = holdingRequest();
        const call = failureOf(
          new Promise((resolve, reject) => {
            (client["GetRelayInfo"] as (...args: unknown[]) => unknown).call(
              client,
              { contractMarker: RELAY_CONTRACT_MARKER },
              new grpc.Metadata(),
              { interceptors: [hold.interceptor] },
              (err: grpc.ServiceError | null, res: unknown) => (err ? reject(err) : resolve(res)),
            );
          }),
        );
        // The server has the stream (its headers) once the call counts as started.
        await eventually(async () => {
          const text = await server.host.metrics.registry.getSingleMetricAsString("grpc_server_started_total");
          const line = text.split("\n").find((l) => l.includes('grpc_method="GetRelayInfo"'));
          expect(line, text).to.not.equal(undefined);
          expect(Number(line!.split(" ").pop())).to.equal(2);
        });
        shutdown = server.host.shutdown();
        hold.release();
        const err = await call;
        expect(err.code).to.equal(grpc.status.UNAVAILABLE);
        expect(err.details).to.equal("server is shutting down");
        expect(trailerReason(err)).to.equal("RELAY_ERROR_REASON_PUBLICATION_UNAVAILABLE");
      } finally {
        await (shutdown ?? server.close());
        await server.close();
      }
    });

    it("leaves other services' drain refusals without the trailer", async () => {
      const shapes = defineModule({
        name: "shapesForTrailers",
        description: "a module outside the relay",
        configSchema: z.strictObject({}).prefault({}),
        create() {
          return { services: [bindService(ShapesService, { unary: (req: unknown) => req } as never)] };
        },
      });
      const server = await startServer({ modules: [shapes] });
      let shutdown: Promise<void> | undefined;
      try {
        const hold = holdingRequest();
        const client = new grpc.Client(server.addr, grpc.credentials.createInsecure());
        try {
          const serialize = (value: Buffer) => value;
          const deserialize = (value: Buffer) => value;
          const method = `/${ShapesService.typeName}/Unary`;
          await new Promise<void>((resolve, reject) => client.waitForReady(Date.now() + 5000, (err) => (err ? reject(err) : resolve())));
          const call = failureOf(
            new Promise((resolve, reject) => {
              client.makeUnaryRequest(method, serialize, deserialize, Buffer.alloc(0), new grpc.Metadata(), { interceptors: [hold.interceptor] }, (err, res) =>
                err ? reject(err) : resolve(res),
              );
            }),
          );
          await eventually(async () => {
            const text = await server.host.metrics.registry.getSingleMetricAsString("grpc_server_started_total");
            expect(text).to.include('grpc_method="Unary"');
          });
          shutdown = server.host.shutdown();
          hold.release();
          const err = await call;
          expect(err.code).to.equal(Code.Unavailable);
          expect(trailerReason(err)).to.equal(undefined);
        } finally {
          client.close();
        }
      } finally {
        await (shutdown ?? server.close());
        await server.close();
      }
    });
  });
});
