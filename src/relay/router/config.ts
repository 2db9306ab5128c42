/**
 * The router module's configuration: the relays it mirrors, the subscriber
 * id it names itself by, the backoff between a failed relay stream and the
 * next, and the outbound channel settings of its relay connections.
 */
import { hostname } from "node:os";
import { z } from "zod";
import { channelConfigSchema } from "../../rpc/index.js";
import { hostPort } from "../../server/index.js";
import { MAX_TIMER_MS } from "../../util/index.js";
import { checkSubscriberId, MAX_SUBSCRIBER_ID_BYTES } from "../wire/index.js";

/**
 * The smallest receive limit of a relay channel: a relay's max_message_bytes
 * defaults to 8 MiB (C.5) and one snapshot chunk can fill it.
 */
export const MIN_RELAY_RECEIVE_BYTES = 8 * 1024 * 1024;

/** Whether `id` is a valid subscriber id (non-empty, at most 128 UTF-8 bytes, no control characters). */
function validSubscriberId(id: string): boolean {
  try {
    checkSubscriberId(id);
    return true;
  } catch {
    return false;
  }
}

/**
 * `<prefix>-<hostname>`, cut to the 128 bytes a subscriber id may have;
 * just the prefix if the host name cannot be part of one.
 */
export function defaultSubscriberId(prefix = "mmgate-router", host: string = hostname()): string {
  let id = `${prefix}-${host}`;
  while (Buffer.byteLength(id, "utf8") > MAX_SUBSCRIBER_ID_BYTES) id = id.slice(0, -1);
  return validSubscriberId(id) ? id : prefix;
}

const subscriberId = z.string().refine(validSubscriberId, `a subscriber id: non-empty, at most ${MAX_SUBSCRIBER_ID_BYTES} UTF-8 bytes, no control characters`);

const backoffMs = z.number().int().min(0).max(MAX_TIMER_MS);

export const routerConfigSchema = z.strictObject({
  /**
   * The relays to mirror, HOST:PORT each; every pool of every relay's
   * catalog is mirrored. The module needs at least one (`mmgate router
   * --relay HOST:PORT`); the empty default only lets the section parse in a
   * process that does not run the module.
   */
  relays: z
    .array(hostPort)
    .default([])
    .refine((r) => new Set(r).size === r.length, "relay addresses must be unique"),
  /** subscriber_id of every relay request (the relay logs it). Default "mmgate-router-<hostname>". */
  subscriberId: subscriberId.default(() => defaultSubscriberId()),
  /** Wait between a failed relay stream and the next: exponential from minMs to maxMs, with jitter. */
  backoff: z
    .strictObject({
      minMs: backoffMs.default(100),
      maxMs: backoffMs.default(10_000),
    })
    .prefault({})
    .refine((b) => b.minMs <= b.maxMs, { message: "backoff.minMs must not exceed backoff.maxMs", path: ["minMs"] }),
  /**
   * Outbound channel settings of the relay connections. The receive limit
   * must hold a relay's largest message (at least 8 MiB); relay streams
   * never end, so a default deadline is refused.
   */
  channel: channelConfigSchema
    .prefault({})
    .refine((c) => c.maxReceiveMessageBytes >= MIN_RELAY_RECEIVE_BYTES, {
      message: `must be at least ${MIN_RELAY_RECEIVE_BYTES} (8 MiB): a relay sends messages up to its max_message_bytes`,
      path: ["maxReceiveMessageBytes"],
    })
    .refine((c) => c.defaultTimeoutMs === 0, {
      message: "must be 0: relay streams stay open for as long as the router runs",
      path: ["defaultTimeoutMs"],
    }),
});

export type RouterConfig = z.output<typeof routerConfigSchema>;
