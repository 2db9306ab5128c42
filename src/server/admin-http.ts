import { createServer } from "node:http";
import type { Server, ServerOptions } from "node:http";
import type { Registry } from "prom-client";
import type { HealthRegistry } from "./health.js";
import { ServingStatus } from "./health.js";

/**
 * The HTTP/1.1 admin listener: Prometheus metrics, liveness and readiness.
 * /healthz answers 200 while the process runs; /readyz answers 200 only
 * while the server is SERVING (503 when draining or taken out of rotation).
 * `options` bound how long a client may take (headers, whole request, idle
 * keep-alive); Node's defaults apply without them.
 */
export function createAdminServer(metrics: Registry, health: HealthRegistry, options: ServerOptions = {}): Server {
  return createServer(options, (req, res) => {
    const path = (req.url ?? "/").split("?", 1)[0];
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.writeHead(405, { allow: "GET, HEAD" }).end();
      return;
    }
    switch (path) {
      case "/metrics":
        metrics.metrics().then(
          (text) => res.writeHead(200, { "content-type": metrics.contentType }).end(text),
          (err: Error) => res.writeHead(500, { "content-type": "text/plain" }).end(`metrics failed: ${err.message}\n`),
        );
        return;
      case "/healthz":
        res.writeHead(200, { "content-type": "text/plain" }).end("ok\n");
        return;
      case "/readyz": {
        const ready = health.get("") === ServingStatus.SERVING;
        res.writeHead(ready ? 200 : 503, { "content-type": "text/plain" }).end(ready ? "ready\n" : "not ready\n");
        return;
      }
      default:
        res.writeHead(404, { "content-type": "text/plain" }).end("not found\n");
    }
  });
}
