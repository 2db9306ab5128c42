/**
 * `mmgate kv publish`: replays router events written as JSON lines in the
 * reference's shape (one RouterEvent per line; u64s as JSON numbers or
 * decimal strings, read exactly) into a relay pool through
 * KvEventService.Publish, and prints the relay's summary. Lines are read and
 * sent as they come, in batches, so a file of any length streams through in
 * bounded memory. Exit codes: 0 every event applied, 1 bad input or the call
 * failed, 2 the relay rejected some events.
 */
import { createReadStream } from "node:fs";
import { createInterface } from "node:readline";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { Command, InvalidArgumentError } from "commander";
import { KvEventService, PublishRequestSchema, RouterEventSchema, type PublishRequest, type RouterEvent as WireRouterEvent } from "../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { routerEventFromJson, RouterEventJsonError, type RouterEvent } from "../kv/index.js";
import { clientTransport, tokenOption, withConnectionOptions, type ConnectionOptions } from "../rpc/index.js";

export interface PublishCliIo {
  readonly out: { write(text: string): unknown };
  readonly err: { write(text: string): unknown };
  /** Standard input for FILE "-". */
  readonly stdin?: NodeJS.ReadableStream;
}

/** A router event as the ingest contract carries it. */
export function routerEventToWire(event: RouterEvent): WireRouterEvent {
  const data = event.data;
  return create(RouterEventSchema, {
    workerId: event.workerId,
    dpRank: event.dpRank,
    eventId: event.eventId,
    storageTier: event.storageTier ?? "",
    residencyDomain: event.residencyDomain ?? "",
    data:
      data.kind === "stored"
        ? {
            case: "stored",
            value: { parentHash: data.parentHash, startPosition: data.startPosition, blocks: data.blocks.map((b) => ({ blockHash: b.blockHash, tokensHash: b.tokensHash })) },
          }
        : data.kind === "removed"
          ? { case: "removed", value: { blockHashes: [...data.blockHashes] } }
          : { case: "cleared", value: {} },
  });
}

type Options = ConnectionOptions & { pool: string; token?: string; batch: number; timeout: number };

function positive(what: string, max: number) {
  return (text: string): number => {
    const n = Number(text);
    if (!/^[0-9]+$/.test(text) || n < 1 || n > max) throw new InvalidArgumentError(`${what} must be an integer from 1 to ${max}`);
    return n;
  };
}

export function kvPublishCommand(io: PublishCliIo = { out: process.stdout, err: process.stderr, stdin: process.stdin }): Command {
  return withConnectionOptions(
    new Command("publish")
      .description("replay router events (the reference's JSON, one per line, from FILE or - for stdin) into a relay pool")
      .argument("<file>", "JSON lines file, or - for standard input")
      .requiredOption("--pool <name>", "the relay pool to publish to (the embedded default is \"default\")")
      .option("--batch <n>", "events per message", positive("--batch", 65_536), 1024)
      .option("--timeout <ms>", "deadline for the whole stream (0: none)", positive("--timeout", 2_147_483_647), 600_000),
  )
    .addOption(tokenOption())
    .action(async (file: string, o: Options) => {
      const input: NodeJS.ReadableStream = file === "-" ? (io.stdin ?? process.stdin) : createReadStream(file);
      const lines = createInterface({ input, crlfDelay: Infinity });
      let inputError: Error | undefined;
      // readline re-emits its input's errors on the interface (unhandled, they would end the process);
      // closing it ends an iteration in progress.
      lines.on("error", (err: Error) => {
        inputError = err;
        lines.close();
      });
      let sent = 0;
      let badLine: RouterEventJsonError | undefined;
      async function* requests(): AsyncGenerator<PublishRequest> {
        let events: WireRouterEvent[] = [];
        let first = true;
        let line = 0;
        // An interface closed before its iteration starts would never end it.
        if (inputError !== undefined) throw inputError;
        for await (const text of lines) {
          line += 1;
          if (text.trim() === "") continue;
          try {
            events.push(routerEventToWire(routerEventFromJson(text)));
          } catch (err) {
            if (!(err instanceof RouterEventJsonError)) throw err;
            badLine = new RouterEventJsonError(err.code, err.path, err.detail, line);
            break;
          }
          if (events.length >= o.batch) {
            yield create(PublishRequestSchema, { pool: first ? o.pool : "", events });
            sent += events.length;
            first = false;
            events = [];
          }
        }
        if (inputError !== undefined) throw inputError;
        // Whatever was read before a bad line still goes (and the pool is named even when that is nothing).
        if (events.length > 0 || first) {
          yield create(PublishRequestSchema, { pool: o.pool, events });
          sent += events.length;
        }
      }
      const client = createClient(KvEventService, clientTransport(o));
      const headers = o.token ? { authorization: `Bearer ${o.token}` } : undefined;
      try {
        const summary = await client.publish(requests(), { headers, timeoutMs: o.timeout });
        if (inputError !== undefined) throw inputError;
        if (badLine !== undefined) {
          // The events before the bad line went through; say so, and what stopped the rest.
          io.err.write(`mmgate kv publish: ${badLine.message}; the ${sent} events before it were published, the rest were not sent\n`);
          process.exitCode = 1;
          return;
        }
        io.out.write(
          `${JSON.stringify({
            pool: o.pool,
            sent,
            applied: summary.applied.toString(),
            rejected: summary.rejected.toString(),
            deltasPublished: summary.deltasPublished.toString(),
            sequence: summary.sequence.toString(),
            rejections: summary.rejections.map((r) => ({ index: r.index.toString(), code: r.code, message: r.message })),
          })}\n`,
        );
        if (summary.rejected > 0n) process.exitCode = 2;
      } catch (err) {
        if (!(err instanceof Error)) throw err;
        io.err.write(`mmgate kv publish: ${inputError !== undefined ? `cannot read ${file}: ${inputError.message}` : err.message}\n`);
        process.exitCode = 1;
      } finally {
        lines.close();
      }
    });
}
