import { expect } from "chai";
import { create } from "@bufbuild/protobuf";
import { createRouterTransport } from "@connectrpc/connect";
import { pino } from "pino";
import { EncodeWorkerService } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { FinishReason_Kind, type AnnotatedOutput } from "../../gen/mmgate/llm/v1/output_pb.js";
import { AnnotatedOutputSchema } from "../../gen/mmgate/llm/v1/output_pb.js";
import { PreprocessedRequestSchema, type PreprocessedRequest } from "../../gen/mmgate/llm/v1/request_pb.js";
import { EncoderRouter, type EncodeBinding, type EncodeMember, type EncodeTarget, type FallbackCause } from "../../src/encode/index.js";
import { RoundRobinPicker } from "../../src/rpc/index.js";
import { eventually } from "../support/index.js";

const logger = pino({ level: "silent" });

function multimodal(): PreprocessedRequest {
  return create(PreprocessedRequestSchema, {
    model: "m",
    tokenIds: [1, 2, 3],
    multiModalData: { image: { items: [{ data: { case: "url", value: "https://example.test/cat.png" } }] } },
  });
}

const terminal = (worker: string): AnnotatedOutput =>
  create(AnnotatedOutputSchema, {
    data: {
      index: 0,
      finishReason: { kind: FinishReason_Kind.STOP },
      encoderResult: { schema_version: 1, worker },
      workerTraceLink: { traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331" },
    },
  });

/** An in-memory Encode worker answering with `outputs(name)`; counts its calls. */
function worker(name: string, calls: Map<string, number>, outputs: (name: string) => AnnotatedOutput[] = (n) => [terminal(n)]): EncodeMember {
  return {
    id: name,
    transport: createRouterTransport((router) =>
      router.service(EncodeWorkerService, {
        async *encode() {
          calls.set(name, (calls.get(name) ?? 0) + 1);
          for (const output of outputs(name)) yield { output };
        },
      }),
    ),
  };
}

/** A committed target over `members`, admitting the ids in `admitted` (changeable live). */
function committedTarget(id: string, members: EncodeMember[], admitted: { ids: string[] }): EncodeTarget & { bindings: EncodeBinding[] } {
  const bindings: EncodeBinding[] = [];
  return {
    id,
    bindings,
    async bind() {
      let picker = new RoundRobinPicker(members.filter((m) => admitted.ids.includes(m.id)));
      let retired = false;
      const binding: EncodeBinding = {
        pick() {
          if (retired) return undefined;
          const now = members.filter((m) => admitted.ids.includes(m.id));
          if (now.map((m) => m.id).join() !== picker.endpoints.map((m) => m.id).join()) picker = picker.rebuild(now);
          return picker.pick();
        },
        close() {
          retired = true;
        },
      };
      bindings.push(binding);
      return binding;
    },
  };
}

describe("encode: EncoderRouter", () => {
  const running: AbortController[] = [];
  function start(router: EncoderRouter): void {
    const stop = new AbortController();
    running.push(stop);
    void router.run(stop.signal);
  }
  afterEach(() => {
    for (const stop of running.splice(0)) stop.abort();
  });

  it("committed admission survives membership changes and endpoint reuse", async () => {
    const calls = new Map<string, number>();
    const members = ["w0", "w1", "w2"].map((n) => worker(n, calls));
    const admitted = { ids: ["w0"] };
    const router = new EncoderRouter({ logger });
    start(router);
    const first = committedTarget("committed:encoders:1", members, admitted);
    router.setTarget(first);
    await eventually(() => expect(router.state).to.equal("active"));

    const encodedBy = async () => ((await router.prepare(multimodal(), { requestId: "r" })).encoderResult as { worker?: string })?.worker;
    for (let i = 0; i < 6; i++) expect(await encodedBy()).to.equal("w0");

    admitted.ids = ["w0", "w1"];
    const seen = new Set<string>();
    for (let i = 0; i < 6; i++) seen.add((await encodedBy())!);
    expect([...seen].sort()).to.deep.equal(["w0", "w1"]);
    expect(calls.get("w2") ?? 0).to.equal(0);

    // The target goes away, then a successor generation admits only w2.
    router.setTarget(undefined);
    expect(router.state).to.equal("unavailable");
    const second = committedTarget("committed:encoders:2", members, { ids: ["w2"] });
    router.setTarget(second);
    expect(router.state).to.equal("pending");
    await eventually(() => expect(router.state).to.equal("active"));
    for (let i = 0; i < 4; i++) expect(await encodedBy()).to.equal("w2");
    // The retired binding fails at once.
    expect(first.bindings[0]!.pick()).to.equal(undefined);
  });

  it("keeps the binding when the same target id comes back", async () => {
    const calls = new Map<string, number>();
    const router = new EncoderRouter({ logger });
    start(router);
    const target = committedTarget("committed:g:1", [worker("w0", calls)], { ids: ["w0"] });
    router.setTarget(target);
    await eventually(() => expect(router.state).to.equal("active"));
    router.setTarget({ ...target });
    expect(router.state).to.equal("active");
    expect(target.bindings).to.have.length(1);
  });

  it("pending activation does not keep the router alive: stopping the driver ends it, and retries stop", async () => {
    let attempts = 0;
    const router = new EncoderRouter({ logger, retryMs: 10 });
    const stop = new AbortController();
    const driving = router.run(stop.signal);
    router.setTarget({
      id: "committed:down:1",
      bind: async () => {
        attempts++;
        throw new Error("no Encode worker reachable");
      },
    });
    await eventually(() => expect(attempts).to.be.at.least(3));
    expect(router.state).to.equal("pending");
    stop.abort();
    await driving;
    const after = attempts;
    await new Promise((r) => setTimeout(r, 50));
    expect(attempts).to.equal(after);
  });

  it("a bind that never settles is abandoned when the target changes", async () => {
    const router = new EncoderRouter({ logger });
    start(router);
    let abandoned = false;
    let binding = false;
    router.setTarget({
      id: "committed:slow:1",
      bind: (signal) => {
        binding = true;
        return new Promise<EncodeBinding>((_, reject) => signal.addEventListener("abort", () => ((abandoned = true), reject(new Error("abandoned")))));
      },
    });
    await eventually(() => expect(binding).to.equal(true));
    const calls = new Map<string, number>();
    router.setTarget(committedTarget("committed:fast:1", [worker("w0", calls)], { ids: ["w0"] }));
    await eventually(() => expect(router.state).to.equal("active"));
    expect(abandoned).to.equal(true);
    expect(router.targetId).to.equal("committed:fast:1");
  });

  describe("prepare", () => {
    async function routerWith(outputs: (name: string) => AnnotatedOutput[]) {
      const fallbacks: FallbackCause[] = [];
      const router = new EncoderRouter({ logger, onFallback: (cause) => fallbacks.push(cause) });
      start(router);
      router.setTarget(committedTarget("committed:t:1", [worker("w0", new Map(), outputs)], { ids: ["w0"] }));
      await eventually(() => expect(router.state).to.equal("active"));
      return { router, fallbacks };
    }

    it("consumes an object-shaped encode terminal: encoder_result and migration_link set, media kept", async () => {
      const { router } = await routerWith((n) => [create(AnnotatedOutputSchema, { data: { tokenIds: [] } }), terminal(n)]);
      const request = multimodal();
      const out = await router.prepare(request, { requestId: "r1" });
      expect(out.encoderResult).to.deep.equal({ schema_version: 1, worker: "w0" });
      expect(out.migrationLink?.traceId).to.equal("0af7651916cd43dd8448eb211c80319c");
      expect(Object.keys(out.multiModalData)).to.deep.equal(["image"]);
      expect(request.encoderResult, "the caller's request is left as it was").to.equal(undefined);
    });

    const failures: [string, (n: string) => AnnotatedOutput[], FallbackCause][] = [
      ["a terminal without encoder_result", () => [create(AnnotatedOutputSchema, { data: { finishReason: { kind: FinishReason_Kind.STOP } } })], "no_encoder_result"],
      ["no terminal", () => [create(AnnotatedOutputSchema, { data: { tokenIds: [1] } })], "no_terminal"],
      ["an error item", (n) => [create(AnnotatedOutputSchema, { event: "error", comment: ["decode failed"] }), terminal(n)], "encode_error"],
      [
        "finish_reason error",
        () => [create(AnnotatedOutputSchema, { data: { finishReason: { kind: FinishReason_Kind.ERROR, errorMessage: "bad media" } } })],
        "encode_error",
      ],
    ];
    for (const [name, outputs, cause] of failures) {
      it(`falls back to downstream on ${name} (${cause}): the original request, unchanged`, async () => {
        const { router, fallbacks } = await routerWith(outputs);
        const request = multimodal();
        const out = await router.prepare(request, { requestId: "r" });
        expect(out).to.equal(request);
        expect(out.encoderResult).to.equal(undefined);
        expect(fallbacks).to.deep.equal([cause]);
      });
    }

    it("falls back when the worker's transport fails", async () => {
      const fallbacks: FallbackCause[] = [];
      const router = new EncoderRouter({ logger, onFallback: (cause) => fallbacks.push(cause) });
      start(router);
      const broken: EncodeMember = { id: "gone", transport: createRouterTransport(() => undefined) };
      router.setTarget(committedTarget("committed:t:1", [broken], { ids: ["gone"] }));
      await eventually(() => expect(router.state).to.equal("active"));
      const request = multimodal();
      expect(await router.prepare(request, { requestId: "r" })).to.equal(request);
      expect(fallbacks).to.deep.equal(["transport"]);
    });

    it("falls back when no member is admitted", async () => {
      const fallbacks: FallbackCause[] = [];
      const router = new EncoderRouter({ logger, onFallback: (cause) => fallbacks.push(cause) });
      start(router);
      router.setTarget(committedTarget("committed:t:1", [worker("w0", new Map())], { ids: [] }));
      await eventually(() => expect(router.state).to.equal("active"));
      const request = multimodal();
      expect(await router.prepare(request, { requestId: "r" })).to.equal(request);
      expect(fallbacks).to.deep.equal(["no_member"]);
    });

    it("passes through probes, text-only requests, requests already encoded, and everything while not active", async () => {
      const calls = new Map<string, number>();
      const router = new EncoderRouter({ logger });
      const probe = multimodal();
      probe.isProbe = true;
      const text = create(PreprocessedRequestSchema, { tokenIds: [1] });
      const emptyLists = create(PreprocessedRequestSchema, { tokenIds: [1], multiModalData: { image: { items: [] } } });
      const encoded = multimodal();
      encoded.encoderResult = { already: true };
      const pending = multimodal();
      expect(await router.prepare(pending, { requestId: "r" })).to.equal(pending);
      start(router);
      router.setTarget(committedTarget("committed:t:1", [worker("w0", calls)], { ids: ["w0"] }));
      await eventually(() => expect(router.state).to.equal("active"));
      for (const request of [probe, text, emptyLists, encoded]) expect(await router.prepare(request, { requestId: "r" })).to.equal(request);
      expect(calls.size).to.equal(0);
    });

    it("sends the request id to the Encode worker", async () => {
      let seen: string | null = null;
      const member: EncodeMember = {
        id: "w0",
        transport: createRouterTransport((router) =>
          router.service(EncodeWorkerService, {
            async *encode(_req, ctx) {
              seen = ctx.requestHeader.get("x-request-id");
              yield { output: terminal("w0") };
            },
          }),
        ),
      };
      const router = new EncoderRouter({ logger });
      start(router);
      router.setTarget(committedTarget("committed:t:1", [member], { ids: ["w0"] }));
      await eventually(() => expect(router.state).to.equal("active"));
      await router.prepare(multimodal(), { requestId: "req-42" });
      expect(seen).to.equal("req-42");
    });
  });
});
