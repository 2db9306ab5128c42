import { readFile } from "node:fs/promises";
import { toJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { Command } from "commander";
import { Code, createClient } from "@connectrpc/connect";
import { EncodeHopService, Lifecycle, MemberState } from "../../gen/mmgate/encode/v1/encode_pb.js";
import type { AnnotatedOutput } from "../../gen/mmgate/llm/v1/output_pb.js";
import { clientTransport, CliError, connectionContext, type ConnectionOptions, EXIT, ioError, reportError, snakeCodeName, STATUS_TIMEOUT_MS, tokenOption, withConnectionOptions, withExitCodes } from "../rpc/index.js";
import { annotatedToJsonValue, preprocessedRequestFromJson } from "../llm/index.js";
import { JsonError, stringifyJson } from "../util/index.js";

/** Where the hop commands write; the process's streams by default. */
export interface HopCliIo {
  readonly out: { write(text: string): unknown };
  readonly err: { write(text: string): unknown };
  readonly stdin?: () => Promise<string>;
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

type Options = ConnectionOptions & { token?: string; json?: boolean };

/** The receipts the token worker put in an output's extra_args, when it has any. */
function receiptsOf(output: AnnotatedOutput): JsonValue[] | undefined {
  const extra = output.data?.extraArgs;
  if (extra === undefined) return undefined;
  const value = toJson(ValueSchema, extra);
  if (typeof value !== "object" || value === null || Array.isArray(value)) return undefined;
  const receipts = value["receipts"];
  return Array.isArray(receipts) ? receipts : undefined;
}

function field(receipt: JsonValue, key: string): JsonValue | undefined {
  return typeof receipt === "object" && receipt !== null && !Array.isArray(receipt) ? receipt[key] : undefined;
}

/** One receipt as a line of text: `image[0] 7a9bbcb11a898630 [16, 16, 3] verified`, or why not, and whether it was released. */
function receiptText(receipt: JsonValue): string {
  const shape = field(receipt, "shape");
  const hash = field(receipt, "content_hash");
  const verified = field(receipt, "verified") === true;
  const releaseError = field(receipt, "release_error");
  const released = field(receipt, "released") === true ? "released" : typeof releaseError === "string" ? `not released: ${releaseError}` : "not released";
  return (
    `receipt ${String(field(receipt, "modality") ?? "")}[${String(field(receipt, "index") ?? "")}] ` +
    `${typeof hash === "string" ? hash : "(no hash)"} [${Array.isArray(shape) ? shape.join(", ") : ""}] ` +
    `${verified ? "verified" : `not verified: ${String(field(receipt, "reason") ?? "")}`}; ${released}`
  );
}

/**
 * `mmgate hop`: send a PreprocessedRequest written in the reference's JSON
 * shape to EncodeHopService.Generate and print each output as one JSON line
 * in the same shape, then the token worker's per-item receipts (text on
 * stderr, or one `{"receipts": [...]}` line on stdout with --json); print
 * GetStatus. Exit codes: 0 done, 1 the call failed or the request file is
 * unreadable or not a valid request (the error names the JSON path), 2 a
 * usage error, 3 (generate) some encoder-result item was not verified.
 */
export function hopCommand(io: HopCliIo = { out: process.stdout, err: process.stderr }): Command {
  const hop = new Command("hop").description("call the multimodal Encode hop (mmgate.encode.v1.EncodeHopService)");
  // `status` is a probe (a default deadline); `generate` runs as long as the request takes.
  const withConnection = (command: Command, defaultTimeoutMs = 0, codes: Readonly<Record<number, string>> = {}) =>
    withExitCodes(withConnectionOptions(command, { defaultTimeoutMs }).addOption(tokenOption()), {
      1: "the call failed, or the request file is unreadable or not a valid request (the error names the JSON path)",
      ...codes,
    });
  withConnection(
    hop
      .command("generate")
      .description(
        "send a PreprocessedRequest (the reference's JSON shape, from FILE or - for stdin) and print each output as a JSON line; " +
          "then the token worker's receipts (one per encoder-result item) as text on stderr, or with --json as one JSON line on stdout",
      )
      .argument("<file>", "request JSON file, or - for standard input"),
    0,
    { [EXIT.partial]: "the token worker could not verify some encoder-result items (their receipts say why)" },
  )
    .option("--json", 'print the receipts as one last JSON line on stdout, {"receipts": [...]}, instead of text on stderr')
    .action(async (file: string, o: Options) => {
      const fail = (err: unknown) => {
        process.exitCode = reportError(io.err, "hop generate", err, connectionContext(o));
      };
      let text: string;
      try {
        text = file === "-" ? await (io.stdin ?? readStdin)() : await readFile(file, "utf8");
      } catch (err) {
        fail(ioError(`cannot read ${file}: ${(err as Error).message}`, err));
        return;
      }
      let request;
      try {
        request = preprocessedRequestFromJson(text);
      } catch (err) {
        if (!(err instanceof JsonError)) throw err;
        fail(new CliError(snakeCodeName(Code.InvalidArgument), `${file}: ${err.message}`, { cause: err }));
        return;
      }
      const headers = o.token ? { authorization: `Bearer ${o.token}` } : undefined;
      let receipts: JsonValue[] | undefined;
      try {
        const client = createClient(EncodeHopService, clientTransport(o));
        for await (const res of client.generate({ request }, headers ? { headers } : {})) {
          if (!res.output) continue;
          io.out.write(`${stringifyJson(annotatedToJsonValue(res.output))}\n`);
          receipts = receiptsOf(res.output) ?? receipts;
        }
      } catch (err) {
        fail(err);
        return;
      }
      if (o.json === true) io.out.write(`${JSON.stringify({ receipts: receipts ?? [] })}\n`);
      else for (const receipt of receipts ?? []) io.err.write(`${receiptText(receipt)}\n`);
      if ((receipts ?? []).some((r) => field(r, "verified") !== true)) process.exitCode = EXIT.partial;
    });
  withConnection(hop.command("status").description("print the hop's GetStatus: lifecycle, target, members and counters"), STATUS_TIMEOUT_MS).action(
    async (o: Options) => {
      try {
        const s = await createClient(EncodeHopService, clientTransport(o)).getStatus({});
        const status = {
          lifecycle: (Lifecycle[s.lifecycle] ?? String(s.lifecycle)).toLowerCase(),
          target_id: s.targetId,
          generation: String(s.generation),
          members: s.members.map((m) => ({
            id: m.id,
            address: m.address,
            state: (MemberState[m.state] ?? String(m.state)).toLowerCase(),
            ...(m.reason !== "" ? { reason: m.reason } : {}),
            ...(m.ejectedUntilUnixMs !== 0n ? { ejected_until: new Date(Number(m.ejectedUntilUnixMs)).toISOString() } : {}),
            requests: String(m.requests),
            failures: String(m.failures),
            consecutive_failures: m.consecutiveFailures,
            ejections: m.ejections,
          })),
          fallbacks: Object.fromEntries(Object.entries(s.fallbacks).map(([k, v]) => [k, String(v)])),
          passthrough: String(s.passthrough),
          encoded: String(s.encoded),
        };
        io.out.write(`${JSON.stringify(status, null, 2)}\n`);
      } catch (err) {
        process.exitCode = reportError(io.err, "hop status", err, connectionContext(o));
      }
    },
  );
  return hop;
}
