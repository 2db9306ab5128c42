/**
 * The `console` module: a page under /console/ on the main port that uses
 * this process's services from the browser, over the Connect protocol, as
 * any browser client would (docs/console.md). It serves files and one small
 * JSON reading; it has no RPCs of its own.
 */
import { once } from "node:events";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Registry } from "prom-client";
import { z } from "zod";
import { defineModule, type HttpRoute, type HttpRouteContext, type HttpRouteRequest, type HttpRouteResponse } from "../server/index.js";
import { ConsoleAssets, ConsoleBuildError, type ConsoleAsset } from "./assets.js";

export const consoleConfigSchema = z.strictObject({
  /** Serve the console under /console/; false leaves those paths to the RPC router (404). */
  enabled: z.boolean().default(true),
});
export type ConsoleConfig = z.output<typeof consoleConfigSchema>;

/** Where the console lives: same origin as the services, so no CORS is needed. */
export const CONSOLE_PATH = "/console/";

/**
 * What the page may do: its own script and style sheet only (no inline
 * script or style, nothing from another origin), calls to this origin,
 * images it made itself (blob: URLs of generated images), no frames,
 * plugins or base rewriting.
 */
export const CONSOLE_CSP = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' blob:",
  "connect-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "frame-ancestors 'none'",
  "form-action 'none'",
].join("; ");

const SECURITY_HEADERS: Readonly<Record<string, string>> = {
  "content-security-policy": CONSOLE_CSP,
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "cross-origin-opener-policy": "same-origin",
  "cross-origin-resource-policy": "same-origin",
  "x-frame-options": "DENY",
};

function send(res: HttpRouteResponse, status: number, headers: Record<string, string>, body?: Buffer | string): void {
  if (res.headersSent || res.destroyed) return;
  (res as ServerResponse).writeHead(status, { ...SECURITY_HEADERS, ...headers });
  if (body === undefined) res.end();
  else res.end(body);
}

/**
 * Waits for the end of the request (a GET's is there at once, its body
 * discarded): answered before it, an HTTP/1.1 connection is closed rather
 * than kept alive for the page's next request.
 */
async function requestRead(req: HttpRouteRequest, signal: AbortSignal): Promise<boolean> {
  if ((req as IncomingMessage).complete || req.readableEnded) return true;
  req.resume();
  // A client gone before its request ended gets no answer (the host logs the request as 499).
  return once(req, "end", { signal }).then(
    () => true,
    () => false,
  );
}

function sendAsset(req: HttpRouteRequest, res: HttpRouteResponse, file: ConsoleAsset): void {
  // Revalidated on every load: the bundle changes with the server, and a 304 costs one round trip.
  const headers = { "content-type": file.contentType, etag: file.etag, "cache-control": "no-cache" };
  if (req.headers["if-none-match"] === file.etag) send(res, 304, headers);
  else send(res, 200, { ...headers, "content-length": String(file.body.length) }, file.body);
}

function sendText(res: HttpRouteResponse, status: number, text: string): void {
  send(res, status, { "content-type": "text/plain; charset=utf-8", "cache-control": "no-store" }, text);
}

/**
 * Open relay streams by kind, read from the process's metrics (the relay
 * module's `kv_dc_relay_subscribers`), or null when no relay runs here. The
 * relay's contract has no subscriber count, and this reading needs nothing
 * of the relay module but its metric's name.
 */
export async function relayStreams(registry: Registry): Promise<Record<string, number> | null> {
  const metric = registry.getSingleMetric("kv_dc_relay_subscribers");
  if (metric === undefined) return null;
  const reading = await metric.get();
  const streams: Record<string, number> = {};
  for (const value of reading.values) {
    const kind = value.labels["stream"];
    if (typeof kind === "string") streams[kind] = value.value;
  }
  return streams;
}

/** The console's routes over its files. */
export function consoleRoutes(assets: ConsoleAssets, registry: Registry): HttpRoute[] {
  const serveFile = async (name: string, req: HttpRouteRequest, res: HttpRouteResponse, ctx: HttpRouteContext) => {
    if (!(await requestRead(req, ctx.signal))) return;
    let files: ReadonlyMap<string, ConsoleAsset>;
    try {
      files = await assets.get();
    } catch (err) {
      if (!(err instanceof ConsoleBuildError)) throw err;
      ctx.logger.error({ err }, "console bundle failed to build");
      sendText(res, 500, `${err.message}\n`);
      return;
    }
    const file = files.get(name);
    if (file === undefined) sendText(res, 404, `no console file ${name.slice(0, 100)}\n`);
    else sendAsset(req, res, file);
  };
  return [
    {
      method: "GET",
      path: CONSOLE_PATH.slice(0, -1),
      name: "console.redirect",
      // The page's relative URLs (app.js) need the trailing slash.
      handle: async (req, res, ctx) => {
        if (!(await requestRead(req, ctx.signal))) return;
        const query = (req.url ?? "").split("?").slice(1).join("?");
        send(res, 308, { location: query === "" ? CONSOLE_PATH : `${CONSOLE_PATH}?${query}`, "content-length": "0" });
      },
    },
    {
      method: "GET",
      path: CONSOLE_PATH,
      name: "console.page",
      handle: (req, res, ctx) => serveFile("index.html", req, res, ctx),
    },
    {
      method: "GET",
      path: `${CONSOLE_PATH}api/relay-streams`,
      name: "console.relay-streams",
      handle: async (req, res, ctx) => {
        if (!(await requestRead(req, ctx.signal))) return;
        const body = JSON.stringify({ streams: await relayStreams(registry) });
        send(res, 200, { "content-type": "application/json", "cache-control": "no-store" }, body);
      },
    },
    {
      method: "GET",
      path: `${CONSOLE_PATH}*`,
      name: "console.asset",
      handle: (req, res, ctx) => serveFile(ctx.pathRest ?? "", req, res, ctx),
    },
  ];
}

export const consoleModule = defineModule({
  name: "console",
  description: "the browser console under /console/: the services seen and used from a page, over the Connect protocol",
  configSchema: consoleConfigSchema,
  create(ctx) {
    if (!ctx.config.enabled) return { services: [] };
    const assets = new ConsoleAssets();
    return {
      services: [],
      httpRoutes: consoleRoutes(assets, ctx.metrics),
      start() {
        ctx.logger.info({ path: CONSOLE_PATH, address: ctx.advertisedAddress }, "console served (built on its first request)");
      },
    };
  },
});
