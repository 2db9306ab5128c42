import type { IncomingHttpHeaders, ServerHttp2Stream } from "node:http2";
import type { DescService } from "@bufbuild/protobuf";
import type { StreamRequest, UnaryRequest } from "@connectrpc/connect";
import { peerOf } from "../rpc-observer.js";
import type { CallHost, Impl, LeanCall, LeanPathOptions, Route } from "./call.js";
import { invokeMethod, negotiatedEncoding } from "./call.js";
import { ConnectCall, connectUnaryFormat } from "./connect.js";
import { GrpcCall } from "./grpc.js";

export type { LeanPathOptions } from "./call.js";

/**
 * The host's lean request path: unary, server-streaming and client-streaming
 * calls over the gRPC protocol with protobuf messages and no request
 * compression, which is nearly every call a gRPC client makes, and unary
 * calls over the Connect protocol (POST, binary or JSON, uncompressed;
 * connect.ts).
 * It decodes the request, runs the same interceptors and the same
 * `ServiceImpl` method connect would, and encodes the answer straight onto
 * the HTTP/2 stream, without connect's per-call async-iterable pipeline,
 * without the HTTP/1 compatibility objects, and without abort machinery no
 * one listens to: a call's `AbortSignal`, request `Headers` and response
 * `Headers` exist only once a handler or interceptor reads them
 * (call.ts, shared by both protocols; grpc.ts: the gRPC protocol).
 *
 * What a client sees is what connect's handler for the protocol sends: the
 * same headers (content type, x-request-id, date), the same trailers, error
 * codes and messages, size limits, deadline parsing, and the same
 * treatment of an unread request body. Anything else (other protocols,
 * compressed requests, bidi streams, Connect streams and GET requests, a
 * response that may be compressed) is left to connect: `serve` returns
 * false.
 */

/** The lean path's routes and the entry point for an HTTP/2 stream. */
export class LeanPath implements CallHost {
  private readonly routes = new Map<string, Route>();
  /** The interceptors applied around a call's method, built once per route. */
  private readonly chains = new Map<Route, (req: UnaryRequest | StreamRequest) => Promise<unknown>>();

  readonly signalledCalls = new Set<LeanCall>();

  constructor(readonly options: LeanPathOptions) {
    const shutdown = options.shutdownSignal;
    const onShutdown = () => {
      for (const call of this.signalledCalls) call.shutdown(shutdown.reason);
      this.signalledCalls.clear();
    };
    if (shutdown.aborted) onShutdown();
    else shutdown.addEventListener("abort", onShutdown, { once: true });
  }

  /**
   * Serves the unary, server-streaming and client-streaming methods of
   * `service` that `implementation` defines; `readMaxBytes`, a receive limit
   * of the service's own (at most the host's), in place of the host's.
   */
  addService(service: DescService, implementation: object, readMaxBytes = this.options.readMaxBytes): void {
    for (const method of service.methods) {
      if (method.methodKind === "bidi_streaming") continue;
      const fn = (implementation as Record<string, unknown>)[method.localName];
      // An unimplemented method is connect's to answer (UNIMPLEMENTED).
      if (typeof fn !== "function") continue;
      const route: Route = {
        method,
        impl: (fn as Impl).bind(implementation),
        streaming: method.methodKind === "server_streaming",
        clientStreaming: method.methodKind === "client_streaming",
        readMaxBytes,
      };
      this.routes.set(`/${service.typeName}/${method.name}`, route);
    }
  }

  /**
   * Takes the stream when the call is one the lean path serves; returns
   * false, having touched nothing, when connect should have it.
   */
  serve(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): boolean {
    const path = headers[":path"];
    if (path === undefined || headers[":method"] !== "POST") return false;
    const route = this.routes.get(path);
    if (route === undefined) return false;
    const type = headers["content-type"];
    if (type === "application/grpc" || type === "application/grpc+proto") {
      const encoding = headers["grpc-encoding"];
      if (encoding !== undefined && encoding !== "identity") return false;
      if (this.options.declineCompressible && negotiatedEncoding(headers["grpc-accept-encoding"]) !== undefined) return false;
      this.options.taken.inc();
      const call = new GrpcCall(this, route, stream, headers, this.options.observer.open(path, headers, peerOf(stream.session?.socket), stream));
      void call.run();
      return true;
    }
    // Connect: unary methods only (a Connect stream has a content type of its own).
    if (route.streaming || route.clientStreaming) return false;
    const binary = connectUnaryFormat(type);
    if (binary === undefined) return false;
    const encoding = headers["content-encoding"];
    if (encoding !== undefined && encoding !== "identity") return false;
    if (this.options.declineCompressible && negotiatedEncoding(headers["accept-encoding"]) !== undefined) return false;
    this.options.taken.inc();
    const call = new ConnectCall(this, route, stream, headers, this.options.observer.open(path, headers, peerOf(stream.session?.socket), stream), binary);
    void call.run();
    return true;
  }

  /** The interceptor chain around `route`'s method, as connect's applyInterceptors builds it. */
  chainFor(route: Route): (req: UnaryRequest | StreamRequest) => Promise<unknown> {
    let chain = this.chains.get(route);
    if (chain === undefined) {
      const invoke = (req: UnaryRequest | StreamRequest) => invokeMethod(route, req);
      chain = [...this.options.interceptors].reverse().reduce(
        (next, interceptor) => interceptor(next as never) as never,
        invoke as (req: UnaryRequest | StreamRequest) => Promise<unknown>,
      );
      this.chains.set(route, chain);
    }
    return chain;
  }
}
