/**
 * A thin shim from node:http2 straight to connect's universal handlers, for
 * bench/rpc.ts's host-shim: what connect-node's adapter does
 * (universalRequestFromNodeRequest, universalResponseToNodeResponse), done
 * on the ServerHttp2Stream without Node's HTTP/2 compatibility objects
 * (Http2ServerRequest, Http2ServerResponse). The handler is connect's own:
 * its per-call pipeline of async iterables (envelopes, parsing,
 * serialization), its context, signal and Headers. It answers what the
 * bench asks and no more: no CORS, no HTTP/1.1, an unknown path is
 * UNIMPLEMENTED.
 */
import type { IncomingHttpHeaders, OutgoingHttpHeaders, ServerHttp2Stream } from "node:http2";
import { constants } from "node:http2";
import type { UniversalHandler } from "@connectrpc/connect/protocol";
import { webHeadersOf } from "../src/wire/index.js";
import { writable } from "./_wire.js";

/** Web Headers as Node's HTTP/2 API takes them, added to `into`. */
function nodeHeaders(headers: Headers | undefined, into: OutgoingHttpHeaders = {}): OutgoingHttpHeaders {
  headers?.forEach((value, name) => {
    into[name] = value;
  });
  return into;
}

/** The "stream" listener that serves `handlers` (by request path). */
export function universalShim(handlers: ReadonlyMap<string, UniversalHandler>, tls = false): (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => void {
  const scheme = tls ? "https" : "http";
  return (stream, headers) => {
    stream.on("error", () => undefined);
    const path = headers[":path"] ?? "";
    const handler = handlers.get(path);
    if (handler === undefined) {
      stream.respond({ ":status": 200, "content-type": "application/grpc", "grpc-status": "12", "grpc-message": "unknown method" }, { endStream: true });
      return;
    }
    // Aborted when the stream closes, as connect-node's is (without the reset's status, which the bench never sees).
    const abort = new AbortController();
    stream.once("close", () => abort.abort());
    void handler({
      httpVersion: "2.0",
      method: headers[":method"] ?? "",
      url: `${scheme}://${headers[":authority"] ?? ""}${path}`,
      // As connect-node converts them: web Headers, pseudo-headers left out.
      header: webHeadersOf(headers),
      // A Readable is an async iterable of its chunks.
      body: stream as AsyncIterable<Uint8Array>,
      signal: abort.signal,
    })
      .then(async (res) => {
        if (stream.destroyed) return;
        stream.respond(nodeHeaders(res.header, { ":status": res.status }), { waitForTrailers: true });
        // The trailer is complete once the body is: read when Node asks for it.
        stream.once("wantTrailers", () => stream.sendTrailers(nodeHeaders(res.trailer)));
        if (res.body !== undefined) {
          for await (const chunk of res.body) {
            if (stream.destroyed) break;
            if (!stream.write(chunk)) await writable(stream, "close");
          }
        }
        if (!stream.destroyed) stream.end();
      })
      .catch(() => {
        if (!stream.destroyed) stream.close(constants.NGHTTP2_INTERNAL_ERROR);
      });
  };
}
