import { z } from "zod";
import { MAX_TIMER_MS } from "../util/index.js";

const MiB = 1024 * 1024;

/** Largest message limit a channel accepts, the same bound the host's own limits have. */
export const MAX_MESSAGE_LIMIT_BYTES = 1024 * MiB;

const bytes = z.number().int().min(1024).max(MAX_MESSAGE_LIMIT_BYTES);
const ms = z.number().int().min(0).max(MAX_TIMER_MS);

/**
 * A module's outbound settings for one kind of peer (its encode workers,
 * say). Every field has a default, so `{}` is a valid section.
 */
export const channelConfigSchema = z
  .strictObject({
    /** Connect with TLS. Default: off (cleartext HTTP/2, prior knowledge). */
    tls: z.boolean().default(false),
    /** PEM file of the CA that signed the peers' certificates; "" (default) trusts the system CAs. Needs `tls`. */
    caFile: z.string().default(""),
    /**
     * Name the peers' certificates are checked against, sent as SNI; "" (default) uses the target's host,
     * without SNI when the host is an IP address. Needs `tls`.
     */
    serverName: z.string().default(""),
    /**
     * PEM certificate (and chain) the channel presents to peers that ask for one (mutual TLS), and its key;
     * both or neither. Re-read when the files change: new connections present the new pair, open ones go on.
     * Needs `tls`.
     */
    certFile: z.string().default(""),
    keyFile: z.string().default(""),
    /**
     * Interval of HTTP/2 PING frames on a connection with open calls, to find a dead peer; 0 turns pings off.
     * Default 30000 (30 s).
     */
    keepaliveIntervalMs: ms.default(30_000),
    /** How long a PING may go unanswered before the connection and its calls are closed. Default 20000 (20 s). */
    keepaliveTimeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(20_000),
    /** A connection without calls for this long is closed (and reopened by the next call). Default 900000 (15 min). */
    idleConnectionTimeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(900_000),
    /** Largest response message accepted; a larger one fails the call with RESOURCE_EXHAUSTED. Default 8 MiB. */
    maxReceiveMessageBytes: bytes.default(8 * MiB),
    /** Largest request message sent; a larger one fails the call before it leaves. Default 8 MiB. */
    maxSendMessageBytes: bytes.default(8 * MiB),
    /** Deadline of a call that sets none itself; 0 (default) means none. An inbound deadline still applies. */
    defaultTimeoutMs: ms.default(0),
    /**
     * Make unary and server-streaming calls on the channel's lean transport (the same interceptors,
     * headers and errors as connect's gRPC transport, a fraction of its per-call cost); false uses
     * connect's transport for every call. Default true.
     */
    leanPath: z.boolean().default(true),
    /**
     * A service credential: `authorization: Bearer <token>` on every call of the channel, in place
     * of any the caller passes on. "" (default): none of its own.
     */
    token: z.string().default(""),
    /** The same, read from a file (a mounted Secret) when the channel is built; surrounding white space is dropped. */
    tokenFile: z.string().default(""),
  })
  .superRefine((c, ctx) => {
    if (c.token !== "" && c.tokenFile !== "") ctx.addIssue({ code: "custom", path: ["tokenFile"], message: "token and tokenFile are alternatives: set one" });
    if (/\s/.test(c.token)) ctx.addIssue({ code: "custom", path: ["token"], message: "a token cannot contain white space" });
    if ((c.certFile === "") !== (c.keyFile === "")) ctx.addIssue({ code: "custom", path: [c.certFile === "" ? "certFile" : "keyFile"], message: "certFile and keyFile go together" });
    if (c.tls) return;
    if (c.caFile !== "") ctx.addIssue({ code: "custom", path: ["caFile"], message: "caFile needs tls: true" });
    if (c.serverName !== "") ctx.addIssue({ code: "custom", path: ["serverName"], message: "serverName needs tls: true" });
    if (c.certFile !== "") ctx.addIssue({ code: "custom", path: ["certFile"], message: "certFile needs tls: true" });
  });

/** Outbound settings, every default applied. */
export type ChannelOptions = z.output<typeof channelConfigSchema>;
/** What a config file may say (every field optional). */
export type ChannelConfigInput = z.input<typeof channelConfigSchema>;

/** The defaults, for code that builds options without a config file. */
export const channelDefaults: ChannelOptions = Object.freeze(channelConfigSchema.parse({}));

/** A channel setting that cannot be used (an unreadable CA file, a key that is not the certificate's); names its field. */
export class ChannelConfigError extends Error {
  override readonly name = "ChannelConfigError";
  constructor(
    /** The setting at fault, e.g. "caFile". */
    readonly field: keyof ChannelOptions,
    /** What is wrong, without the field name. */
    readonly detail: string,
  ) {
    super(`${field}: ${detail}`);
  }
}
