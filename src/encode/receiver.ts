import type { JsonObject, JsonValue } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type HandlerContext, type Transport } from "@connectrpc/connect";
import type { Logger } from "pino";
import { Counter, type Registry } from "prom-client";
import { z } from "zod";
import { MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import {
  canonicalContentHash,
  contentHashForTensor,
  decodeNixlMetadata,
  formatContentHashKey,
  parseDescriptorJson,
  type MediaDataDescriptor,
} from "../media/index.js";
import { channelConfigSchema, ChannelPool, inProcessTransport, outboundContextValues, readTokenFile, withCallContext } from "../rpc/index.js";
import { codeName, ConfigError, hostPort, requestIdOf, type LocalRoutes } from "../server/index.js";
import { AcquireError, cancelledOnExit, MAX_TIMER_MS, registeredMetric, Semaphore } from "../util/index.js";

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

/**
 * The `tokenWorker.receiver` config section: how the token worker reads,
 * verifies and releases the tensors an encoder result hands it. Every key
 * defaulted, so `{}` parses.
 */
export const receiverConfigSchema = z
  .strictObject({
    /**
     * Largest tensor read, in bytes, checked against the descriptor's size
     * before anything is allocated. Default 128 MiB, the media module's
     * decoder.maxAlloc (the largest image an Encode worker produces with
     * its defaults); raise it to 512 MiB (video.maxAlloc) for large videos.
     */
    maxTensorBytes: z.number().int().min(1).max(4 * GiB).default(128 * MiB),
    /**
     * Tensors being read (and held) at once across all requests; more wait
     * for a slot within the call's timeout. Peak memory of the reads is
     * maxTensorBytes × maxConcurrentReads. Default 4.
     */
    maxConcurrentReads: z.number().int().min(1).max(1024).default(4),
    /** Items of one encoder result read; the rest are reported unread (and not released). Default 64. */
    maxItems: z.number().int().min(0).max(4096).default(64),
    /**
     * Deadline of each ReadTensor (the whole stream, the wait for a read slot
     * included) and of each ReleaseTensor call. Default 10000 (10 s).
     */
    timeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(10_000),
    /**
     * Service credential sent as `authorization: Bearer <token>` on
     * ReadTensor and ReleaseTensor (the Encode workers' auth.token); it wins
     * over the inbound call's own authorization header. "" (default): pass
     * the inbound header on, when the call has one.
     */
    token: z.string().default(""),
    /** The same credential read from a file (surrounding white space dropped) at start-up; excludes `token`. "" (default): none. */
    tokenFile: z.string().default(""),
    /**
     * The tensor store endpoints (HOST:PORT) the worker may read from; an
     * item naming another is reported unread. Empty (default): any. Set it
     * when a service credential is configured, so that a request cannot
     * send the credential to an address it chose.
     */
    allowedEndpoints: z.array(hostPort).default([]),
    /** Outbound channel settings (TLS, keepalive, limits) for tensor stores in other processes. */
    channel: channelConfigSchema.prefault({}),
  })
  .refine((r) => !/\s/.test(r.token), { message: "a token cannot contain white space", path: ["token"] })
  .refine((r) => r.token === "" || r.tokenFile === "", { message: "token and tokenFile exclude each other", path: ["tokenFile"] });

export type ReceiverConfig = z.output<typeof receiverConfigSchema>;

/**
 * Why an item was not verified: the first word of its receipt's `reason`
 * and the `result` label of `mmgate_token_worker_receipts_total`.
 */
export type ReceiptFailure =
  | "invalid_item"
  | "unsupported_agent"
  | "endpoint_not_allowed"
  | "too_many_items"
  | "too_large"
  | "cancelled"
  | "timeout"
  | "unreachable"
  | "not_found"
  | "unauthenticated"
  | "read_failed"
  | "no_content_hash"
  | "hash_mismatch";

/** What the token worker reports for one item of an encoder result. */
export interface Receipt {
  readonly modality: string;
  readonly index: number;
  /** The hash the encoder result claims for the item (16 hex digits), null when it claims none. */
  readonly content_hash: string | null;
  readonly shape: readonly number[];
  /** The bytes were read in full and hash to `content_hash`. */
  readonly verified: boolean;
  /** `<failure>: <detail>` when not verified. */
  readonly reason?: string;
  /** The hash of the bytes read, when they were read and it differs from `content_hash`. */
  readonly received_content_hash?: string;
  /** ReleaseTensor dropped the tensor (false: not called, the handle was unknown, or the call failed). */
  readonly released: boolean;
  /** Why the ReleaseTensor call failed, when it did. */
  readonly release_error?: string;
}

/** A receipt as the JSON the final output's extra_args carries. */
export function receiptToJson(receipt: Receipt): JsonObject {
  return { ...receipt, shape: [...receipt.shape] };
}

class ReceiptError extends Error {
  override readonly name = "ReceiptError";
  constructor(
    readonly failure: ReceiptFailure,
    message: string,
    readonly received?: string,
  ) {
    super(message);
  }
}

/** Points where a test holds or alters a read (never set in production). */
export interface ReceiverSeams {
  /**
   * Runs once an item's bytes have arrived, before their hash is checked;
   * `data` is the receiver's own copy (a test may change it), `signal` the
   * inbound call's.
   */
  readonly afterRead?: (read: { readonly modality: string; readonly index: number; readonly data: Uint8Array; readonly signal: AbortSignal }) => Promise<void> | void;
}

export interface ReceiverDeps {
  readonly config: ReceiverConfig;
  readonly logger: Logger;
  readonly metrics: Registry;
  /** This process's address as other processes reach it: an endpoint equal to it is read in memory. */
  readonly advertisedAddress: string;
  readonly localRoutes: LocalRoutes;
  readonly seams?: ReceiverSeams;
}

/** The agent metadata an mmgate tensor store writes into nixl_metadata (src/media/descriptor.ts). */
interface AgentMetadata {
  readonly endpoint: string;
  readonly service: string;
}

function agentOf(descriptor: MediaDataDescriptor): AgentMetadata {
  let agent: unknown;
  try {
    agent = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(decodeNixlMetadata(descriptor.nixl_metadata)));
  } catch (err) {
    throw new ReceiptError("unsupported_agent", `nixl_metadata does not name an mmgate tensor store: ${(err as Error).message}`);
  }
  const a = agent as Partial<Record<string, unknown>> | null;
  if (typeof a !== "object" || a === null || typeof a["endpoint"] !== "string" || a["service"] !== MediaService.typeName) {
    throw new ReceiptError("unsupported_agent", `nixl_metadata does not name an mmgate tensor store (${MediaService.typeName})`);
  }
  if (!hostPort.safeParse(a["endpoint"]).success) {
    throw new ReceiptError("unsupported_agent", `the agent's endpoint ${JSON.stringify(a["endpoint"])} is not HOST:PORT`);
  }
  return { endpoint: a["endpoint"], service: a["service"] };
}

/** What an item says about itself (as the Encode worker writes it), read leniently: its receipt repeats it. */
function itemFacts(item: JsonValue, position: number): { modality: string; index: number; content_hash: string | null; shape: number[] } {
  const o = typeof item === "object" && item !== null && !Array.isArray(item) ? item : {};
  return {
    modality: typeof o["modality"] === "string" ? o["modality"] : "",
    index: typeof o["index"] === "number" ? o["index"] : position,
    content_hash: typeof o["content_hash"] === "string" ? o["content_hash"] : null,
    shape: Array.isArray(o["shape"]) ? o["shape"].filter((d): d is number => typeof d === "number") : [],
  };
}

/** The descriptor of an item, parsed as the media module writes it. */
function descriptorOf(item: JsonObject): MediaDataDescriptor {
  const raw = item["descriptor"];
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw new ReceiptError("invalid_item", "the item has no descriptor object");
  try {
    return parseDescriptorJson(JSON.stringify(raw));
  } catch (err) {
    throw new ReceiptError("invalid_item", (err as Error).message);
  }
}

/**
 * The canonical content hash of bytes read, as the Encode worker's decoders
 * compute it: the video rule for video metadata (src/media/video-decoder.ts),
 * the image rule otherwise (src/media/image-decoder.ts).
 */
function hashOf(descriptor: MediaDataDescriptor, data: Uint8Array): bigint | null {
  const info = descriptor.tensor_info;
  if (info.metadata !== null && "Video" in info.metadata) return contentHashForTensor(info, data, true);
  return canonicalContentHash(info.shape, info.dtype, data);
}

function describeCallError(err: unknown, endpoint: string, what: string, timeoutMs: number): ReceiptError {
  if (err instanceof ReceiptError) return err;
  if (err instanceof AcquireError) {
    return err.reason === "deadline"
      ? new ReceiptError("timeout", `no read slot within tokenWorker.receiver.timeoutMs (${timeoutMs} ms)`)
      : new ReceiptError("cancelled", "the call ended while waiting for a read slot");
  }
  const e = ConnectError.from(err);
  switch (e.code) {
    case Code.Canceled:
      return new ReceiptError("cancelled", `the call ended during the ${what}`);
    case Code.DeadlineExceeded:
      return new ReceiptError("timeout", `${what} from ${endpoint} did not finish within its deadline (tokenWorker.receiver.timeoutMs ${timeoutMs} ms, or the call's): ${e.rawMessage}`);
    case Code.Unavailable:
      return new ReceiptError("unreachable", `cannot reach the tensor store at ${endpoint}: ${e.rawMessage}`);
    case Code.NotFound:
      return new ReceiptError("not_found", `${endpoint}: ${e.rawMessage}`);
    case Code.Unauthenticated:
    case Code.PermissionDenied:
      return new ReceiptError("unauthenticated", `${endpoint} refused the ${what} (${e.rawMessage}); set tokenWorker.receiver.token or tokenFile`);
    default:
      return new ReceiptError("read_failed", `${what} from ${endpoint} failed: [${codeName(e.code)}] ${e.rawMessage}`);
  }
}

/** A credential from `token` or `tokenFile`; "" when neither is set. */
function serviceToken(config: ReceiverConfig): string {
  if (config.tokenFile === "") return config.token;
  try {
    return readTokenFile(config.tokenFile);
  } catch (err) {
    throw new ConfigError(`tokenWorker.receiver.tokenFile: ${(err as Error).message}`);
  }
}

/** What one receive needs from the inbound call. */
export type InboundCall = Pick<HandlerContext, "signal" | "requestHeader" | "values" | "timeoutMs">;

/**
 * The receiving end of the Encode worker's data path: for each item of an
 * encoder result, reads the tensor from the store its descriptor names
 * (`MediaService.ReadTensor`, in memory when that store is this process),
 * checks its canonical content hash, and releases it (`ReleaseTensor`)
 * whatever happened to the read.
 */
export class TensorReceiver {
  private readonly config: ReceiverConfig;
  private readonly logger: Logger;
  private readonly token: string;
  private readonly local: Transport;
  private readonly pool: ChannelPool;
  private readonly slots: Semaphore;
  private readonly advertisedAddress: string;
  private readonly seams: ReceiverSeams;
  private readonly results: Counter<"result">;

  constructor(deps: ReceiverDeps) {
    this.config = deps.config;
    this.logger = deps.logger;
    this.token = serviceToken(deps.config);
    this.advertisedAddress = deps.advertisedAddress;
    this.seams = deps.seams ?? {};
    this.local = inProcessTransport({ routes: deps.localRoutes.routes, interceptors: deps.localRoutes.interceptors, registry: deps.metrics });
    this.pool = new ChannelPool(deps.config.channel, { registry: deps.metrics, logger: deps.logger });
    this.slots = new Semaphore(deps.config.maxConcurrentReads);
    const name = "mmgate_token_worker_receipts_total";
    this.results = registeredMetric(
      deps.metrics,
      name,
      Counter,
      () =>
        new Counter({
          name,
          help: "Encoder-result items the token worker received: result is verified, or why not (the receipt's reason).",
          labelNames: ["result"],
          registers: [deps.metrics],
        }),
    ) as Counter<"result">;
  }

  /** Closes the channels to other processes, ending calls still open. */
  close(): void {
    this.pool.abort();
  }

  private transportFor(endpoint: string): Transport {
    if (endpoint === this.advertisedAddress) return this.local;
    try {
      return this.pool.get(endpoint);
    } catch (err) {
      throw new ReceiptError("read_failed", `cannot open a channel to ${endpoint}: ${(err as Error).message}`);
    }
  }

  /** The authorization header of the outbound calls: the service credential, else the inbound call's own. */
  private headersOf(call: InboundCall): Record<string, string> {
    if (this.token !== "") return { authorization: `Bearer ${this.token}` };
    const inbound = call.requestHeader.get("authorization");
    return inbound === null ? {} : { authorization: inbound };
  }

  /**
   * One receipt per item of `encoderResult.items`, in order. Never throws:
   * every failure becomes the item's reason. Each tensor whose descriptor
   * names a store is released before this resolves, also when the inbound
   * call ended meanwhile (the release has its own deadline, not the call's).
   */
  async receive(encoderResult: JsonObject, call: InboundCall): Promise<Receipt[]> {
    const items = encoderResult["items"];
    if (!Array.isArray(items)) return [];
    const receipts: Receipt[] = [];
    for (const [position, item] of items.entries()) {
      const receipt =
        position < this.config.maxItems
          ? await this.receiveItem(item, position, call)
          : this.unread(
              item,
              position,
              new ReceiptError(
                "too_many_items",
                `the encoder result has ${items.length} items, more than tokenWorker.receiver.maxItems (${this.config.maxItems}); not read or released`,
              ),
            );
      this.results.inc({ result: receipt.verified ? "verified" : (receipt.reason?.split(":", 1)[0] ?? "unknown") });
      receipts.push(receipt);
    }
    return receipts;
  }

  /** The receipt of an item that was never read or released. */
  private unread(item: JsonValue, position: number, error: ReceiptError): Receipt {
    return { ...itemFacts(item, position), verified: false, reason: `${error.failure}: ${error.message}`, released: false };
  }

  private async receiveItem(item: JsonValue, position: number, call: InboundCall): Promise<Receipt> {
    if (typeof item !== "object" || item === null || Array.isArray(item)) {
      return this.unread(item, position, new ReceiptError("invalid_item", "the item is not a JSON object"));
    }
    let descriptor: MediaDataDescriptor;
    let agent: AgentMetadata;
    try {
      descriptor = descriptorOf(item);
      agent = agentOf(descriptor);
      if (this.config.allowedEndpoints.length > 0 && !this.config.allowedEndpoints.includes(agent.endpoint)) {
        throw new ReceiptError("endpoint_not_allowed", `${agent.endpoint} is not in tokenWorker.receiver.allowedEndpoints; not read or released`);
      }
    } catch (err) {
      if (!(err instanceof ReceiptError)) throw err;
      return this.unread(item, position, err);
    }
    const given = itemFacts(item, position);
    const claimedItem = given.content_hash;
    const facts = { ...given, content_hash: claimedItem ?? descriptor.content_hash, shape: [...descriptor.tensor_info.shape] };
    const handle = descriptor.nixl_descriptor.addr;
    const requestId = requestIdOf(call);

    let failure: ReceiptError | undefined;
    let released = false;
    let releaseError: string | undefined;
    let transport: Transport | undefined;
    try {
      transport = this.transportFor(agent.endpoint);
      await this.readAndVerify(transport, agent.endpoint, descriptor, claimedItem, facts, call);
    } catch (err) {
      failure = describeCallError(err, agent.endpoint, "read", this.config.timeoutMs);
    } finally {
      // The receiver owns the release: whatever became of the read (the
      // caller may have gone), under its own deadline only.
      if (transport !== undefined) {
        try {
          const res = await createClient(MediaService, transport).releaseTensor(
            { handle },
            { headers: this.headersOf(call), timeoutMs: this.config.timeoutMs, contextValues: withCallContext({ requestId }) },
          );
          released = res.released;
        } catch (err) {
          const error = describeCallError(err, agent.endpoint, "release", this.config.timeoutMs);
          releaseError = `${error.failure}: ${error.message}`;
          this.logger.warn({ requestId, endpoint: agent.endpoint, handle: String(handle), err: releaseError }, "tensor release failed; it stays until the store's TTL");
        }
      }
    }
    if (failure !== undefined) {
      this.logger.warn({ requestId, modality: facts.modality, index: facts.index, endpoint: agent.endpoint, reason: failure.message }, "encoder-result item not verified");
    }
    return {
      ...facts,
      verified: failure === undefined,
      ...(failure !== undefined ? { reason: `${failure.failure}: ${failure.message}` } : {}),
      ...(failure?.received !== undefined ? { received_content_hash: failure.received } : {}),
      released,
      ...(releaseError !== undefined ? { release_error: releaseError } : {}),
    };
  }

  /** Reads the tensor into a buffer of the descriptor's size and checks its hash; throws a ReceiptError otherwise. */
  private async readAndVerify(
    transport: Transport,
    endpoint: string,
    descriptor: MediaDataDescriptor,
    claimedItem: string | null,
    facts: { modality: string; index: number; content_hash: string | null; shape: number[] },
    call: InboundCall,
  ): Promise<void> {
    const { size, mem_type: memType, addr: handle } = descriptor.nixl_descriptor;
    if (claimedItem !== null && descriptor.content_hash !== null && claimedItem !== descriptor.content_hash) {
      throw new ReceiptError("invalid_item", `the item's content_hash ${claimedItem} differs from its descriptor's ${descriptor.content_hash}`);
    }
    if (memType !== "Dram") throw new ReceiptError("unsupported_agent", `mem_type ${memType} cannot be read from a tensor store (Dram only)`);
    const elements = descriptor.tensor_info.shape.reduce((n, d) => n * d, 1);
    if (elements !== size) throw new ReceiptError("invalid_item", `the descriptor's size ${size} does not match its shape [${facts.shape.join(", ")}] (${elements} bytes)`);
    if (size > this.config.maxTensorBytes) {
      throw new ReceiptError("too_large", `the tensor is ${size} bytes, more than tokenWorker.receiver.maxTensorBytes (${this.config.maxTensorBytes})`);
    }
    if (call.signal.aborted) throw new ReceiptError("cancelled", "the call ended before the read");
    const timeoutMs = this.config.timeoutMs;
    // One deadline for the wait for a slot and the read.
    const deadline = Date.now() + timeoutMs;
    const permit = await this.slots.acquire(call.signal, deadline);
    try {
      const remainingMs = deadline - Date.now();
      if (remainingMs <= 0) throw new ReceiptError("timeout", `no read slot within tokenWorker.receiver.timeoutMs (${timeoutMs} ms)`);
      const data = new Uint8Array(size);
      let written = 0;
      // A read refused part way (a chunk out of place) cancels the stream: the store would go on writing into it.
      const stream = cancelledOnExit(call.signal, (signal) =>
        createClient(MediaService, transport).readTensor({ handle }, { headers: this.headersOf(call), signal, timeoutMs: remainingMs, contextValues: outboundContextValues(call) }),
      );
      for await (const chunk of stream) {
        if (chunk.totalSize !== BigInt(size)) {
          throw new ReceiptError("read_failed", `${endpoint} holds ${chunk.totalSize} bytes under handle ${handle}, the descriptor says ${size}`);
        }
        if (chunk.offset !== BigInt(written) || written + chunk.data.length > size) {
          throw new ReceiptError("read_failed", `${endpoint} sent ${chunk.data.length} bytes at ${chunk.offset}, expected them at ${written} (of ${size})`);
        }
        data.set(chunk.data, written);
        written += chunk.data.length;
      }
      if (written !== size) throw new ReceiptError("read_failed", `the read from ${endpoint} ended after ${written} of ${size} bytes`);
      await this.seams.afterRead?.({ modality: facts.modality, index: facts.index, data, signal: call.signal });
      let received: bigint | null;
      try {
        received = hashOf(descriptor, data);
      } catch (err) {
        throw new ReceiptError("invalid_item", `the descriptor's tensor info cannot be hashed: ${(err as Error).message}`);
      }
      if (received === null) throw new ReceiptError("no_content_hash", "the tensor is empty or its metadata cannot be hashed");
      const key = formatContentHashKey(received);
      if (facts.content_hash === null) throw new ReceiptError("no_content_hash", `the encoder result claims no content hash (the bytes hash to ${key})`, key);
      if (key !== facts.content_hash) {
        throw new ReceiptError("hash_mismatch", `the bytes read hash to ${key}, the encoder result says ${facts.content_hash}`, key);
      }
    } finally {
      permit.release();
    }
  }
}
