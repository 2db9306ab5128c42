/**
 * With tracing off (the default), the hop's outbound calls carry exactly
 * the trace context its caller sent, as before tracing existed: none
 * invented when there was none, the caller's passed on unchanged when there
 * was one; and nothing is exported, even with an endpoint configured.
 */
import { create } from "@bufbuild/protobuf";
import { expect } from "chai";
import { createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { z } from "zod";
import { EncodeHopService, EncodeResponseSchema, EncodeWorkerService, Lifecycle } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { FinishReason_Kind, OutputType } from "../../gen/mmgate/llm/v1/output_pb.js";
import { GenerateResponseSchema, TokenWorkerService } from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { bindService, defineModule } from "../../src/server/index.js";
import { eventually, startChildServer, startServer, type ChildServer, type InProcessServer } from "../support/index.js";
import { newTraceparent, startOtlpReceiver } from "./otlp-receiver.js";

const CONTEXT = ["traceparent", "tracestate", "baggage"] as const;
type Seen = Record<(typeof CONTEXT)[number], string | null>;

/** An Encode worker that answers with an error item (the hop falls back) and a token worker that answers at once; both note the trace headers they got. */
function recordingWorkers(seen: { encode: Seen[]; generate: Seen[] }) {
  const headersOf = (h: Headers): Seen => Object.fromEntries(CONTEXT.map((name) => [name, h.get(name)])) as Seen;
  return defineModule({
    name: "recordingWorkers",
    description: "test: records the trace headers of the hop's calls",
    configSchema: z.object({}),
    create() {
      return {
        services: [
          bindService(EncodeWorkerService, {
            async *encode(_req, ctx) {
              seen.encode.push(headersOf(ctx.requestHeader));
              yield create(EncodeResponseSchema, { output: { event: "error", comment: ["no encoding here"] } });
            },
          }),
          bindService(TokenWorkerService, {
            async *generate(_req, ctx) {
              seen.generate.push(headersOf(ctx.requestHeader));
              yield create(GenerateResponseSchema, { output: { data: { outputType: OutputType.TEXT, finishReason: { kind: FinishReason_Kind.STOP }, index: 0 } } });
            },
          }),
        ],
      };
    },
  });
}

describe("telemetry: with tracing off, outbound calls carry what the caller sent and nothing is exported", function () {
  this.timeout(60_000);
  const seen = { encode: [] as Seen[], generate: [] as Seen[] };
  let receiver: Awaited<ReturnType<typeof startOtlpReceiver>>;
  let workers: InProcessServer;
  let hop: ChildServer;
  let client: Client<typeof EncodeHopService>;

  before(async () => {
    receiver = await startOtlpReceiver();
    workers = await startServer({ modules: [recordingWorkers(seen)] });
    hop = await startChildServer(["--modules", "encodeHop"], {
      // An endpoint alone in the file's section does not turn tracing on.
      MMGATE_TELEMETRY__TRACING__ENDPOINT: receiver.endpoint,
      MMGATE_ENCODE_HOP__DOWNSTREAM: workers.addr,
      MMGATE_ENCODE_HOP__ENCODERS__DISCOVERY: "static",
      MMGATE_ENCODE_HOP__ENCODERS__MEMBERS: JSON.stringify([{ id: "fake", address: workers.addr }]),
    });
    client = createClient(EncodeHopService, createGrpcTransport({ baseUrl: hop.baseUrl }));
    await eventually(async () => expect((await client.getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE), { timeoutMs: 20_000 });
  });
  after(async () => {
    await hop?.close();
    await workers?.close();
    await receiver?.close();
  });

  async function generate(headers: Record<string, string>): Promise<void> {
    const request = { tokenIds: [1], multiModalData: { image: { items: [{ data: { case: "url" as const, value: "https://media.invalid/fox.png" } }] } } };
    for await (const _ of client.generate({ request }, { headers })) void _;
  }

  it("no traceparent in: none on the Encode call or the downstream call", async () => {
    await generate({});
    const none: Seen = { traceparent: null, tracestate: null, baggage: null };
    expect(seen.encode.at(-1)).to.deep.equal(none);
    expect(seen.generate.at(-1)).to.deep.equal(none);
  });

  it("a caller's trace context is passed on as it came, to both calls", async () => {
    const caller = newTraceparent();
    const sent: Seen = { traceparent: caller.header, tracestate: "vendor=opaque", baggage: "tenant=blue" };
    await generate({ traceparent: sent.traceparent!, tracestate: sent.tracestate!, baggage: sent.baggage! });
    expect(seen.encode.at(-1)).to.deep.equal(sent);
    expect(seen.generate.at(-1)).to.deep.equal(sent);
  });

  it("nothing is exported, through the shutdown that would flush it, and log lines name no span", async () => {
    await hop.close();
    expect(receiver.requests).to.deep.equal([]);
    const lines = hop.stdout.filter((l) => l.startsWith("{"));
    expect(lines.some((l) => l.includes('"rpc finished"'))).to.equal(true);
    expect(lines.filter((l) => l.includes('"trace_id"') || l.includes("tracing on"))).to.deep.equal([]);
  });
});
