/**
 * `mmgate relay watch ADDR`: mirrors a relay's pools as a router would
 * (a RelayConsumer) and shows what arrives. It prints the catalog (one line
 * per pool), a progress bar per pool while its snapshot arrives (on a
 * terminal), then a status line per second with each pool's delta rate,
 * installed sequence and lag. `--json` prints every consumer event as a
 * JSON line instead (u64s as decimal strings; a catalog event also lists
 * the pools). `--decoded` prints every update the mirror accepts, its
 * payload as the protobuf JSON of Cbi1Frame. `--once` exits 0 once every
 * pool is ready.
 *
 * Exit codes: 0 when --once saw every pool ready, when --timeout ended a
 * watch whose catalog stream was open, or on a clean end; 1 when the relay
 * refused the contract, when --timeout ended with the relay unreachable
 * (its last error is named), when --once timed out before every pool was
 * ready, or when --once found a pool quarantined; 2 a usage error; 130
 * after Ctrl-C.
 */
import { MultiBar, Presets, type SingleBar } from "cli-progress";
import { Code } from "@connectrpc/connect";
import { Command, InvalidArgumentError, Option } from "commander";
import { caOption, clientCertificateOptions, clientTransport, CliError, connectionContext, plainMessage, reportError, reportWarning, snakeCodeName, timeoutOption, tlsMismatch, tlsOption, withExitCodes } from "../rpc/index.js";
import { hostPort } from "../server/index.js";
import { FilterUpdateKind, FilterUpdateKindSchema, type FilterUpdate } from "../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { FilterFormat } from "./cbi1/index.js";
import { cbi1FrameJson } from "./cli.js";
import { RelayConsumer, type ConsumerFailure, type PoolView, type RelayConsumerEvent } from "./consumer/index.js";
import { frameToProto } from "./decoded/index.js";
import { defaultSubscriberId } from "./router/index.js";
import { checkSubscriberId, endpointName } from "./wire/index.js";

export interface WatchCliIo {
  readonly out: { write(text: string): unknown };
  readonly err: { write(text: string): unknown };
  /** Draw progress bars on `err` (default: standard error is a terminal). */
  readonly progress?: boolean;
  /** Whether `out` is the terminal the bars are drawn on (default: standard output is a terminal). */
  readonly outIsTerminal?: boolean;
}

interface WatchOptions {
  decoded?: boolean;
  tls?: boolean;
  ca?: string;
  cert?: string;
  key?: string;
  json?: boolean;
  once?: boolean;
  timeout: number;
  subscriberId?: string;
}

/** How often the status line is printed (ms). */
const STATUS_INTERVAL_MS = 1000;

/** Exit code after Ctrl-C. */
const INTERRUPTED = 130;

function subscriberIdArg(text: string): string {
  try {
    return checkSubscriberId(text);
  } catch (err) {
    throw new InvalidArgumentError((err as Error).message);
  }
}

function relayAddress(text: string): string {
  const parsed = hostPort.safeParse(text);
  if (!parsed.success) throw new InvalidArgumentError(parsed.error.issues[0]?.message ?? "expected HOST:PORT");
  return text;
}

/**
 * One accepted update for --decoded: the pool, the update's kind and
 * sequences, and its payload decoded (the mirror has already checked it).
 */
function decodedLine(pool: string, update: FilterUpdate): string {
  const ckf = update.producer?.ckfFormat;
  const frame =
    update.kind === FilterUpdateKind.HEARTBEAT || ckf === undefined
      ? undefined
      : cbi1FrameJson(frameToProto(update.payload, { format: new FilterFormat(ckf.seed, Number(ckf.bucketCount)), sparse: true }));
  return jsonLine({
    pool,
    // The enum value's proto name, as protobuf JSON writes it.
    kind: FilterUpdateKindSchema.value[update.kind]?.name ?? String(update.kind),
    baseSequence: update.baseSequence,
    sequence: update.sequence,
    sendTsUs: update.sendTsUs,
    ...(frame === undefined ? {} : { frame }),
  });
}

/** JSON with u64s (bigints) as decimal strings. */
function jsonLine(value: unknown): string {
  return `${JSON.stringify(value, (_key, v: unknown) => (typeof v === "bigint" ? v.toString() : v))}\n`;
}

function failureText(error: ConsumerFailure): string {
  return error.message === "" ? error.reason : `${error.reason}: ${plainMessage(error.message)}`;
}

/** A pool as the catalog describes it, for --json. */
function describePool(view: PoolView): Record<string, unknown> {
  const d = view.descriptor;
  const base = { key: view.key, dcId: view.poolId.dcId, state: view.state };
  if (d === undefined) return { ...base, unsupported: view.lastError?.message ?? "" };
  const producer = d.producer;
  return {
    ...base,
    endpoint: endpointName(d.servingEndpoint),
    models: d.registrations.map((r) => ({
      model: r.model,
      aliases: r.aliases,
      ...(r.target.kind === "lora" ? { loraBase: r.target.baseModel, adapter: r.target.adapter } : {}),
    })),
    blockSize: d.querySemantics.kvBlockSize,
    hashFormat: d.querySemantics.hashFormat,
    bucketCount: producer.format.bucketCount,
    seed: producer.format.seed,
    producerIncarnation: producer.producerIncarnation,
    layoutGeneration: producer.layoutGeneration,
    roles: d.poolRoles,
  };
}

/** One catalog line's models: "model (aliases a, b)", "adapter (LoRA on base)". */
function modelsText(view: PoolView): string {
  return (view.descriptor?.registrations ?? [])
    .map((r) => {
      const notes = [
        ...(r.target.kind === "lora" ? [`LoRA on ${r.target.baseModel}`] : []),
        ...(r.aliases.length > 0 ? [`aliases ${r.aliases.join(", ")}`] : []),
      ];
      return notes.length > 0 ? `${r.model} (${notes.join("; ")})` : r.model;
    })
    .join(", ");
}

/** Progress bars of the snapshots being assembled, on a terminal; lines printed meanwhile go above them. */
class SnapshotBars {
  private multi: MultiBar | undefined;
  private readonly bars = new Map<string, SingleBar>();

  constructor(
    private readonly io: WatchCliIo,
    private readonly enabled: boolean,
    private readonly outIsTerminal: boolean,
  ) {}

  progress(pool: string, label: string, received: number, expected: number): void {
    if (!this.enabled) return;
    let bar = this.bars.get(pool);
    if (bar === undefined) {
      if (received >= expected) return;
      this.multi ??= new MultiBar(
        { format: "{label} snapshot [{bar}] {value}/{total} chunks", hideCursor: true, clearOnComplete: false, stream: this.io.err as NodeJS.WritableStream },
        Presets.shades_classic,
      );
      bar = this.multi.create(expected, received, { label });
      this.bars.set(pool, bar);
      return;
    }
    bar.setTotal(expected);
    bar.update(received);
  }

  /** The pool's snapshot is over (installed, abandoned, or the pool left). */
  done(pool: string): void {
    const bar = this.bars.get(pool);
    if (bar === undefined || this.multi === undefined) return;
    this.bars.delete(pool);
    this.multi.remove(bar);
    if (this.bars.size === 0) this.stop();
  }

  /** A line for standard output, above the bars while they are drawn on the same terminal. */
  line(text: string): void {
    if (this.multi !== undefined && this.outIsTerminal) this.multi.log(`${text}\n`);
    else this.io.out.write(`${text}\n`);
  }

  stop(): void {
    this.multi?.stop();
    this.multi = undefined;
    this.bars.clear();
  }
}

/** Watches `addr`; resolves with the exit code. */
export async function watchRelay(addr: string, o: WatchOptions, io: WatchCliIo): Promise<number> {
  const transport = clientTransport({ addr, ...(o.tls !== undefined ? { tls: o.tls } : {}), ...(o.ca !== undefined ? { ca: o.ca } : {}), ...(o.cert !== undefined ? { cert: o.cert } : {}), ...(o.key !== undefined ? { key: o.key } : {}) });
  const json = o.json === true;
  const decoded = o.decoded === true;
  const bars = new SnapshotBars(io, !json && (io.progress ?? process.stderr.isTTY === true), io.outIsTerminal ?? process.stdout.isTTY === true);
  const controller = new AbortController();
  let outcome: { code: number; error?: CliError } | undefined;
  const finish = (code: number, error?: CliError) => {
    if (outcome !== undefined) return;
    outcome = error === undefined ? { code } : { code, error };
    controller.abort();
  };
  const tlsContext = context(addr, o);

  /** Short pool labels, "[1]", "[2]", ... in the order pools first appear. */
  const labels = new Map<string, string>();
  const label = (key: string) => {
    let l = labels.get(key);
    if (l === undefined) labels.set(key, (l = `[${labels.size + 1}]`));
    return l;
  };
  const deltas = new Map<string, number>();
  let printedRevision: bigint | undefined;
  let lastCatalogError: string | undefined;

  const consumer: RelayConsumer = new RelayConsumer({
    transport,
    subscriberId: o.subscriberId ?? defaultSubscriberId("mmgate-relay-watch"),
    relay: addr,
    onEvent: (event) => {
      if (json) io.out.write(jsonLine(event.type === "catalog" ? { ...event, catalog: consumer.pools().map(describePool) } : event));
      else if (!decoded) human(event);
      if (o.once === true) checkOnce();
    },
    // --decoded: every accepted update as a JSON line, its payload as the protobuf JSON of Cbi1Frame.
    ...(decoded ? { onUpdate: (pool: string, update: FilterUpdate) => io.out.write(decodedLine(pool, update)) } : {}),
  });

  const human = (event: RelayConsumerEvent) => {
    switch (event.type) {
      case "catalog": {
        lastCatalogError = undefined;
        const changed = event.added.length + event.removed.length + event.replaced.length > 0;
        if (!changed && printedRevision === event.revision) return;
        printedRevision = event.revision;
        bars.line(`relay ${addr} catalog revision ${event.revision}: ${event.pools} pool${event.pools === 1 ? "" : "s"}`);
        for (const view of consumer.pools()) {
          const d = view.descriptor;
          if (d === undefined) {
            bars.line(`  ${label(view.key)} dc ${view.poolId.dcId}  quarantined: ${view.lastError?.message ?? "unsupported descriptor"}  pool ${view.key}`);
            continue;
          }
          bars.line(
            `  ${label(view.key)} dc ${view.poolId.dcId}  endpoint ${endpointName(d.servingEndpoint)}  models ${modelsText(view)}  ` +
              `block ${d.querySemantics.kvBlockSize}  ${d.querySemantics.hashFormat}  ${d.producer.format.bucketCount} buckets  pool ${view.key}`,
          );
        }
        for (const r of event.rejected) bars.line(`  rejected catalog entry ${r.index}${r.key === undefined ? "" : ` (pool ${r.key})`}: ${r.reason}: ${r.message}`);
        return;
      }
      case "catalog-error": {
        const text = failureText(event.error);
        if (text !== lastCatalogError) reportWarning(io.err, COMMAND, `${addr}: catalog stream: ${text}; retrying`);
        lastCatalogError = text;
        return;
      }
      case "snapshot-progress":
        bars.progress(event.pool, label(event.pool), event.chunksReceived, event.chunksExpected);
        return;
      case "ready":
        bars.done(event.pool);
        bars.line(`${label(event.pool)} ready at sequence ${event.sequence}`);
        return;
      case "delta":
        deltas.set(event.pool, (deltas.get(event.pool) ?? 0) + 1);
        return;
      case "invalidated":
        bars.done(event.pool);
        bars.line(`${label(event.pool)} invalidated: ${failureText(event.error)}; resubscribing in ${event.retryInMs} ms`);
        return;
      case "quarantined":
        bars.done(event.pool);
        bars.line(`${label(event.pool)} quarantined: ${failureText(event.error)}`);
        return;
      case "withdrawn":
        bars.done(event.pool);
        bars.line(`${label(event.pool)} withdrawn from the catalog`);
        return;
      default:
        return;
    }
  };

  const checkOnce = () => {
    if (consumer.catalog().revision === undefined) return;
    const pools = consumer.pools();
    if (!pools.every((p) => p.state === "ready" || p.state === "quarantined")) return;
    const quarantined = pools.filter((p) => p.state === "quarantined");
    if (quarantined.length === 0) finish(0);
    else finish(1, new CliError(snakeCodeName(Code.FailedPrecondition), quarantined.map((p) => `pool ${p.key} is quarantined: ${p.lastError?.message ?? "unsupported"}`).join("; ")));
  };

  let lastTick = performance.now();
  const status = () => {
    const now = performance.now();
    const seconds = Math.max(1e-3, (now - lastTick) / 1000);
    lastTick = now;
    const pools = consumer.pools();
    if (pools.length === 0) return;
    const wall = Date.now();
    const parts = pools.map((view) => {
      const rate = (deltas.get(view.key) ?? 0) / seconds;
      const l = label(view.key);
      switch (view.state) {
        case "ready": {
          const lag = view.lastSendTsUs === undefined || view.lastFrameAt === undefined ? "" : `  lag ${(view.lastFrameAt - Number(view.lastSendTsUs) / 1000).toFixed(1)} ms`;
          const age = view.lastFrameAt === undefined ? "" : `  last frame ${((wall - view.lastFrameAt) / 1000).toFixed(1)} s ago`;
          return `${l} seq ${view.installedSequence}  ${rate.toFixed(1)} deltas/s${lag}${age}`;
        }
        case "assembling":
          return `${l} assembling ${view.progress.chunksReceived}/${view.progress.chunksExpected}`;
        case "backoff":
          return `${l} backoff${view.lastError === undefined ? "" : ` (${view.lastError.reason})`}`;
        default:
          return `${l} ${view.state}`;
      }
    });
    deltas.clear();
    bars.line(`${new Date(wall).toISOString().slice(11, 19)} ${parts.join(" | ")}`);
  };

  const timeoutEnd = () => {
    const catalog = consumer.catalog();
    if (!catalog.connected) {
      const last = catalog.lastError === undefined ? "no catalog arrived" : failureText(catalog.lastError);
      const mismatch = tlsMismatch(last, tlsContext);
      finish(1, new CliError(snakeCodeName(Code.Unavailable), `could not reach relay ${addr} within ${o.timeout} ms: ${last}`, { hints: mismatch ? [mismatch.hint] : [] }));
      return;
    }
    if (o.once === true) {
      const waiting = consumer
        .pools()
        .filter((p) => p.state !== "ready")
        .map((p) => `${p.key} ${p.state}${p.state === "assembling" ? ` ${p.progress.chunksReceived}/${p.progress.chunksExpected}` : ""}`);
      finish(1, new CliError(snakeCodeName(Code.DeadlineExceeded), `timed out after ${o.timeout} ms before every pool was ready: ${waiting.join(", ")}`));
      return;
    }
    finish(0);
  };

  const timers: NodeJS.Timeout[] = [];
  if (o.timeout > 0) timers.push(setTimeout(timeoutEnd, o.timeout));
  if (!json && !decoded) timers.push(setInterval(status, STATUS_INTERVAL_MS));
  const onSigint = () => finish(INTERRUPTED);
  process.once("SIGINT", onSigint);
  try {
    const result = await consumer.run(controller.signal);
    if (result.stopped === "contract-mismatch") finish(1, new CliError(snakeCodeName(Code.FailedPrecondition), `relay ${addr} refused the KV relay contract: ${failureText(result.error)}`));
  } finally {
    for (const timer of timers) clearTimeout(timer);
    process.removeListener("SIGINT", onSigint);
    bars.stop();
  }
  const end = outcome ?? { code: 0 };
  if (end.error !== undefined) reportError(io.err, COMMAND, end.error);
  return end.code;
}

const COMMAND = "relay watch";

export function relayWatchCommand(io: WatchCliIo = { out: process.stdout, err: process.stderr }): Command {
  const command = new Command("watch")
    .description("mirror every pool of a KV relay as a router would, and show the catalog, snapshot progress, delta rates and lag")
    .argument("<addr>", "the relay, HOST:PORT", relayAddress)
    .addOption(tlsOption())
    .addOption(caOption())
    .option("--json", "print every consumer event as a JSON line (u64s as decimal strings)")
    .option(
      "--decoded",
      "print every update the mirror accepts as a JSON line: pool, kind, sequences and the CBI1 payload as the protobuf JSON of mmgate.kvrelay.v1.Cbi1Frame (snapshot chunks as their non-zero words)",
    )
    .option("--once", "exit once every pool is ready (0), or when one is quarantined (1)")
    .addOption(timeoutOption("deadline of the watch: stop after this long, in milliseconds or a duration (30s, 5m); 0 for none. Exit 1 if the relay was unreachable, or with --once if a pool is not ready"))
    .addOption(new Option("--subscriber-id <id>", "subscriber_id of the requests (default mmgate-relay-watch-<hostname>)").argParser(subscriberIdArg))
    .action(async (addr: string, o: WatchOptions) => {
      try {
        process.exitCode = await watchRelay(addr, o, io);
      } catch (err) {
        process.exitCode = reportError(io.err, COMMAND, err, context(addr, o));
      }
    });
  for (const option of clientCertificateOptions()) command.addOption(option);
  return withExitCodes(command, {
    0: "--once saw every pool ready, or --timeout ended a watch whose relay answered",
    1: "the relay refused the contract or was unreachable within --timeout, or with --once: a pool quarantined or not ready within --timeout",
    130: "interrupted (Ctrl-C)",
  });
}

function context(addr: string, o: WatchOptions) {
  return connectionContext({ addr, ...(o.tls !== undefined ? { tls: o.tls } : {}), ...(o.ca !== undefined ? { ca: o.ca } : {}), ...(o.cert !== undefined ? { cert: o.cert } : {}) });
}

/** `mmgate relay …`. */
export function relayCommand(io?: WatchCliIo): Command {
  return new Command("relay")
    .description("KV relays by hand: watch a relay's catalog and pool streams as a router would mirror them")
    .addCommand(relayWatchCommand(io));
}
