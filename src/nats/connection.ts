/**
 * A NATS connection's settings as every part of mmgate that talks to NATS
 * takes them (the relay's KV event source, the image API's shared
 * idempotency keys and quotas): the servers, the credentials, the name and
 * the timings, checked the same way, and the client options they become.
 */
import type { ConnectionOptions } from "nats";
import { z } from "zod";
import { hostPort } from "../server/index.js";
import { MAX_TIMER_MS } from "../util/index.js";

/** Why `server` is neither `HOST:PORT` nor a `nats://HOST:PORT` URL, or undefined when it is one. */
export function natsServerProblem(server: string): string | undefined {
  if (!server.includes("://")) return hostPort.safeParse(server).success ? undefined : "expected HOST:PORT or a nats:// URL";
  let url: URL;
  try {
    url = new URL(server);
  } catch {
    return "expected HOST:PORT or a nats:// URL";
  }
  if (url.protocol !== "nats:") return "expected a nats:// URL";
  if (url.hostname === "") return "the URL has no host";
  if (url.username !== "" || url.password !== "") return "put credentials in user/pass or token, not in the URL";
  if ((url.pathname !== "" && url.pathname !== "/") || url.search !== "" || url.hash !== "") return "a nats:// URL has only a host and a port";
  return undefined;
}

/** NATS servers, `HOST:PORT` or `nats://HOST:PORT`; the client picks one and fails over to the others. */
export const natsServersSchema = z
  .array(
    z.string().superRefine((server, ctx) => {
      const problem = natsServerProblem(server);
      if (problem !== undefined) ctx.addIssue({ code: "custom", message: problem });
    }),
  )
  .min(1)
  .default(["127.0.0.1:4222"]);

/** The credential fields of a connection's settings, to spread into its schema. */
export const natsCredentialFields = {
  /** Token authentication; not with user/pass. */
  token: z.string().min(1).optional(),
  /** User/password authentication; both or neither. */
  user: z.string().min(1).optional(),
  pass: z.string().min(1).optional(),
};

/** Pause between attempts to reconnect to a lost server. */
export const natsReconnectWaitSchema = z.int().min(0).max(MAX_TIMER_MS).default(1000);

/** The credential rules (user and pass together, not with a token), for a schema's superRefine. */
export function checkNatsCredentials(c: { readonly token?: string; readonly user?: string; readonly pass?: string }, ctx: z.RefinementCtx): void {
  if ((c.user === undefined) !== (c.pass === undefined)) {
    ctx.addIssue({ code: "custom", path: [c.user === undefined ? "user" : "pass"], message: "user and pass go together" });
  }
  if (c.token !== undefined && c.user !== undefined) ctx.addIssue({ code: "custom", path: ["token"], message: "token and user/pass exclude each other" });
}

export interface NatsConnectionSettings {
  readonly servers: readonly string[];
  /** The name the server shows in its monitoring. */
  readonly name: string;
  readonly connectTimeoutMs: number;
  readonly reconnectWaitMs: number;
  readonly token?: string | undefined;
  readonly user?: string | undefined;
  readonly pass?: string | undefined;
}

/**
 * The client's options: reconnecting for ever, and a first connection that
 * fails left to the caller to retry (each part degrades or waits in its own
 * way), not to the client.
 */
export function natsConnectionOptions(c: NatsConnectionSettings): ConnectionOptions {
  return {
    servers: [...c.servers],
    name: c.name,
    timeout: c.connectTimeoutMs,
    reconnect: true,
    maxReconnectAttempts: -1,
    reconnectTimeWait: c.reconnectWaitMs,
    waitOnFirstConnect: false,
    ...(c.token === undefined ? {} : { token: c.token }),
    ...(c.user === undefined ? {} : { user: c.user, pass: c.pass }),
  };
}
