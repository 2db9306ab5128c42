import { readFile } from "node:fs/promises";
import { Command } from "commander";
import { Code, createClient } from "@connectrpc/connect";
import { EncodeHopService, Lifecycle } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { clientTransport, CliError, connectionContext, type ConnectionOptions, ioError, reportError, snakeCodeName, STATUS_TIMEOUT_MS, tokenOption, withConnectionOptions, withExitCodes } from "../rpc/index.js";
import { annotatedToJsonValue, LlmJsonError, preprocessedRequestFromJson, stringifyJson } from "../llm/index.js";

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

type Options = ConnectionOptions & { token?: string };

/**
 * `mmgate hop`: send a PreprocessedRequest written in the reference's JSON
 * shape to EncodeHopService.Generate and print each output as one JSON line
 * in the same shape; print GetStatus. Exit codes: 0 done, 1 the call
 * failed or the request file is unreadable or not a valid request (the
 * error names the JSON path), 2 a usage error.
 */
export function hopCommand(io: HopCliIo = { out: process.stdout, err: process.stderr }): Command {
  const hop = new Command("hop").description("call the multimodal Encode hop (mmgate.encode.v1.EncodeHopService)");
  // `status` is a probe (a default deadline); `generate` runs as long as the request takes.
  const withConnection = (command: Command, defaultTimeoutMs = 0) =>
    withExitCodes(withConnectionOptions(command, { defaultTimeoutMs }).addOption(tokenOption()), {
      1: "the call failed, or the request file is unreadable or not a valid request (the error names the JSON path)",
    });
  withConnection(
    hop
      .command("generate")
      .description("send a PreprocessedRequest (the reference's JSON shape, from FILE or - for stdin) and print each output as a JSON line")
      .argument("<file>", "request JSON file, or - for standard input"),
  ).action(async (file: string, o: Options) => {
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
      if (!(err instanceof LlmJsonError)) throw err;
      fail(new CliError(snakeCodeName(Code.InvalidArgument), `${file}: ${err.message}`, { cause: err }));
      return;
    }
    const headers = o.token ? { authorization: `Bearer ${o.token}` } : undefined;
    try {
      const client = createClient(EncodeHopService, clientTransport(o));
      for await (const res of client.generate({ request }, headers ? { headers } : {})) {
        if (res.output) io.out.write(`${stringifyJson(annotatedToJsonValue(res.output))}\n`);
      }
    } catch (err) {
      fail(err);
    }
  });
  withConnection(hop.command("status").description("print the hop's GetStatus: lifecycle, target, members and counters"), STATUS_TIMEOUT_MS).action(
    async (o: Options) => {
      try {
        const s = await createClient(EncodeHopService, clientTransport(o)).getStatus({});
        const status = {
          lifecycle: (Lifecycle[s.lifecycle] ?? String(s.lifecycle)).toLowerCase(),
          target_id: s.targetId,
          generation: String(s.generation),
          members: s.members.map((m) => ({ id: m.id, address: m.address, requests: String(m.requests), failures: String(m.failures) })),
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
