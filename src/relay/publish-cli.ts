/**
 * `mmgate kv publish`: replays router events written as JSON lines in the
 * reference's shape (one RouterEvent per line; u64s as JSON numbers or
 * decimal strings, read exactly) into a relay pool through
 * KvEventService.Publish, and prints the relay's summary. Lines are read and
 * sent as they come, in batches, so a file of any length streams through in
 * bounded memory; a line is refused as TOO_LARGE as soon as it passes the
 * event limit (MAX_ROUTER_EVENT_JSON_BYTES), without reading the rest of it.
 * Exit codes: 0 every event applied, 1 bad input or the call
 * failed, 2 a usage error, 3 the relay rejected some events.
 */
import { createReadStream } from "node:fs";
import type { Readable } from "node:stream";
import { create } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { Command, InvalidArgumentError } from "commander";
import { clientTransport, CliError, connectionContext, type ConnectionOptions, EXIT, ioError, reportError, snakeCodeName, tokenOption, withConnectionOptions, withExitCodes } from "../rpc/index.js";
import { KvEventService, PublishRequestSchema, RouterEventSchema, type PublishRequest, type RouterEvent as WireRouterEvent } from "../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { MAX_ROUTER_EVENT_JSON_BYTES, routerEventFromJson, RouterEventJsonError, type RouterEvent } from "../kv/index.js";
import { boundedLines, LineTooLongError } from "../util/index.js";

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

type Options = ConnectionOptions & { pool: string; token?: string; batch: number };

function positive(what: string, max: number) {
  return (text: string): number => {
    const n = Number(text);
    if (!/^[0-9]+$/.test(text) || n < 1 || n > max) throw new InvalidArgumentError(`${what} must be an integer from 1 to ${max}`);
    return n;
  };
}

export function kvPublishCommand(io: PublishCliIo = { out: process.stdout, err: process.stderr, stdin: process.stdin }): Command {
  const command = withConnectionOptions(
    new Command("publish")
      .description("replay router events (the reference's JSON, one per line, from FILE or - for stdin) into a relay pool")
      .argument("<file>", "JSON lines file, or - for standard input")
      .requiredOption("--pool <name>", "the relay pool to publish to (the embedded default is \"default\")")
      .option("--batch <n>", "events per message", positive("--batch", 65_536), 1024),
  )
    .addOption(tokenOption())
    .action(async (file: string, o: Options) => {
      const fail = (err: unknown) => {
        process.exitCode = reportError(io.err, "kv publish", err, connectionContext(o));
      };
      const fileStream = file === "-" ? undefined : createReadStream(file);
      const input: NodeJS.ReadableStream = fileStream ?? io.stdin ?? process.stdin;
      // Lines that stop early leave the stream unread, not destroyed (that would be an AbortError): the
      // file is closed below, standard input stays open as readline left it.
      const source: AsyncIterable<string | Uint8Array> = typeof (input as Readable).iterator === "function" ? (input as Readable).iterator({ destroyOnReturn: false }) : input;
      let inputError: Error | undefined;
      let reading = true;
      // Kept from the start: an error emitted before the lines are read (ENOENT) would otherwise end the process.
      const onInputError = (err: Error) => {
        if (reading) inputError ??= err;
      };
      input.on("error", onInputError);
      let sent = 0;
      let badLine: RouterEventJsonError | undefined;
      /** The input's lines; a read error ends them (kept in inputError), a line over the event limit is badLine. */
      async function* lines(): AsyncGenerator<string> {
        try {
          // Stops reading a line once it passes the limit: routerEventFromJson would refuse it anyway.
          yield* boundedLines(source, MAX_ROUTER_EVENT_JSON_BYTES);
        } catch (err) {
          if (err instanceof LineTooLongError) {
            // The line number and message routerEventFromJson's refusal has.
            badLine = new RouterEventJsonError("TOO_LARGE", "$", `input is larger than ${MAX_ROUTER_EVENT_JSON_BYTES} bytes`, err.line);
          } else if (err instanceof Error) {
            inputError ??= err;
          } else {
            throw err;
          }
        } finally {
          reading = false;
        }
      }
      async function* requests(): AsyncGenerator<PublishRequest> {
        let events: WireRouterEvent[] = [];
        let first = true;
        let line = 0;
        if (inputError !== undefined) throw inputError;
        for await (const text of lines()) {
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
      const headers = o.token ? { authorization: `Bearer ${o.token}` } : undefined;
      try {
        const client = createClient(KvEventService, clientTransport(o));
        const summary = await client.publish(requests(), headers ? { headers } : {});
        if (inputError !== undefined) throw inputError;
        if (badLine !== undefined) {
          // The events before the bad line went through; say so, and what stopped the rest.
          const message = `${badLine.message}; the ${sent} events before it were published, the rest were not sent`;
          fail(new CliError(snakeCodeName(Code.InvalidArgument), message, { cause: badLine }));
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
        if (summary.rejected > 0n) process.exitCode = EXIT.partial;
      } catch (err) {
        if (!(err instanceof Error)) throw err;
        fail(inputError !== undefined ? ioError(`cannot read ${file}: ${inputError.message}`, inputError) : err);
      } finally {
        // Reading stops here whatever happened: a file is closed, standard input is no longer read.
        if (fileStream !== undefined) fileStream.destroy();
        else input.removeListener("error", onInputError);
      }
    });
  return withExitCodes(command, {
    [EXIT.ok]: "every event applied",
    [EXIT.failure]: "a line is no router event (the events before it were published), the file could not be read, or the call failed",
    [EXIT.partial]: "the relay rejected some events (the summary lists them)",
  });
}
