import { Code, createClient, type ConnectError } from "@connectrpc/connect";
import { expect } from "chai";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import { ImageError } from "../../src/images/core/errors.js";
import { defineImagesModule } from "../../src/images/index.js";
import { createImageRequest, zeroTimings, type ImageResponse } from "../../src/images/model.js";
import {
  MemoryIdempotencyStore,
  requestFingerprint,
  responseWeight,
  withHeaderKey,
  type IdempotencyLimits,
} from "../../src/images/runtime/idempotency.js";
import { eventually, expectRejection, metricValue, startServer } from "../support/index.js";
import { FakeProvider } from "./fake-provider.js";
import { expectThrow, rejection } from "./helpers.js";

function response(bytes = 0): ImageResponse {
  const parameters = createImageRequest({ prompt: "p" }).parameters;
  return {
    id: "first",
    created: 1,
    provider: "x",
    model: "m",
    requested: parameters,
    effective: parameters,
    normalizations: [],
    data: [{ index: 0, format: "png", width: 1, height: 1, bytes, sha256: "0".repeat(64), data: new Uint8Array(bytes) }],
    failures: [],
    timings: zeroTimings(),
    warnings: [],
  };
}

const LIMITS: IdempotencyLimits = { maxEntries: 3, maxCompletedBytes: 100_000, completedTtlMs: 1000, unknownTtlMs: 5000 };
const live = () => new AbortController().signal;

describe("images: idempotency keys", () => {
  describe("store", () => {
    let now = 0;
    const store = (limits: Partial<IdempotencyLimits> = {}) => new MemoryIdempotencyStore({ ...LIMITS, ...limits }, () => now);
    beforeEach(() => {
      now = 0;
    });

    it("runs a key once: a concurrent call joins, a later one replays", async () => {
      const s = store();
      let calls = 0;
      let finish!: (r: ImageResponse) => void;
      const work = () => {
        calls += 1;
        return new Promise<ImageResponse>((resolve) => (finish = resolve));
      };
      const first = s.run("scope", "k", "fp", live(), work);
      const joined = s.run("scope", "k", "fp", live(), work);
      finish(response());
      expect((await first).replayed).to.equal(false);
      expect((await joined).replayed).to.equal(true);
      const replay = await s.run("scope", "k", "fp", live(), work);
      expect(replay).to.deep.include({ replayed: true });
      expect(replay.response.id).to.equal("first");
      expect(calls).to.equal(1);
    });

    it("keys are per scope; another request under the same key is idempotency_conflict", async () => {
      const s = store();
      await s.run("a", "k", "fp", live(), async () => response());
      const error = await rejection(s.run("a", "k", "other", live(), async () => response()));
      expect(error.code).to.equal("idempotency_conflict");
      expect((await s.run("b", "k", "other", live(), async () => response())).replayed).to.equal(false);
    });

    it("forgets a failure that never produced anything, remembers an unknown outcome", async () => {
      const s = store();
      let calls = 0;
      const refused = () => {
        calls += 1;
        return Promise.reject(new ImageError("overloaded", "full", { retryable: true }));
      };
      await rejection(s.run("s", "k", "fp", live(), refused));
      await rejection(s.run("s", "k", "fp", live(), refused));
      expect(calls).to.equal(2);

      const unknown = () => {
        calls += 1;
        return Promise.reject(new ImageError("timeout", "gone", { details: { outcome: "unknown" } }));
      };
      await rejection(s.run("s", "u", "fp", live(), unknown));
      const replayed = await rejection(s.run("s", "u", "fp", live(), unknown));
      expect(replayed.details["outcome"]).to.equal("unknown");
      expect(calls).to.equal(3);
      now = 5000;
      await rejection(s.run("s", "u", "fp", live(), unknown));
      expect(calls).to.equal(4);
    });

    it("expires completed responses after completedTtlMs", async () => {
      const s = store();
      let calls = 0;
      const work = async () => {
        calls += 1;
        return response();
      };
      await s.run("s", "k", "fp", live(), work);
      now = 999;
      await s.run("s", "k", "fp", live(), work);
      now = 1000;
      await s.run("s", "k", "fp", live(), work);
      expect(calls).to.equal(2);
    });

    it("bounds entries: the least recently used completed response goes; pending calls are never evicted", async () => {
      const s = store();
      for (const key of ["a", "b", "c"]) await s.run("s", key, "fp", live(), async () => response());
      await s.run("s", "a", "fp", live(), async () => response()); // a is now the most recent
      await s.run("s", "d", "fp", live(), async () => response());
      expect(s.size).to.equal(3);
      let calls = 0;
      await s.run("s", "b", "fp", live(), async () => {
        calls += 1;
        return response();
      });
      expect(calls).to.equal(1);

      const full = store({ maxEntries: 1 });
      void full.run("s", "pending", "fp", live(), () => new Promise<ImageResponse>(() => undefined));
      const error = await rejection(full.run("s", "other", "fp", live(), async () => response()));
      expect(error.code).to.equal("overloaded");
      expect(error.details).to.deep.include({ limit: "idempotency" });
      expect(error.retryable).to.equal(true);
    });

    it("bounds bytes: evicts old responses; one too large to keep is not replayed and not run again", async () => {
      const s = store({ maxEntries: 100, maxCompletedBytes: 3 * responseWeight(response(20_000)) });
      for (const key of ["a", "b", "c", "d"]) await s.run("s", key, "fp", live(), async () => response(20_000));
      expect(s.bytes).to.be.at.most(3 * responseWeight(response(20_000)));
      expect(s.size).to.equal(3);

      const big = await s.run("s", "big", "fp", live(), async () => response(200_000));
      expect(big.response.data[0]!.bytes).to.equal(200_000);
      const error = await rejection(s.run("s", "big", "fp", live(), async () => response(200_000)));
      expect(error.code).to.equal("overloaded");
      expect(error.details).to.deep.include({ outcome: "completed_unreplayable" });
      expect(error.retryable).to.equal(false);
    });

    it("a caller that gives up stops waiting; the work goes on and is replayed", async () => {
      const s = store();
      let finish!: (r: ImageResponse) => void;
      const controller = new AbortController();
      const first = s.run("s", "k", "fp", controller.signal, () => new Promise<ImageResponse>((resolve) => (finish = resolve)));
      controller.abort();
      expect((await rejection(first)).code).to.equal("cancelled");
      finish(response());
      await eventually(async () => expect(s.bytes).to.be.above(0));
      expect((await s.run("s", "k", "fp", live(), () => Promise.reject(new Error("not again")))).replayed).to.equal(true);
    });
  });

  describe("request identity", () => {
    it("fingerprints the normalized request without idempotency_key and timeout_ms", () => {
      const base = { prompt: "fox", referenceImages: [{ data: new Uint8Array([1, 2, 3]) }] };
      const fp = requestFingerprint(createImageRequest(base));
      expect(requestFingerprint(createImageRequest({ ...base, idempotencyKey: "k", timeoutMs: 5 }))).to.equal(fp);
      expect(requestFingerprint(createImageRequest({ ...base, parameters: { n: 1 } }))).to.equal(fp);
      expect(requestFingerprint(createImageRequest({ ...base, prompt: "fox!" }))).to.not.equal(fp);
      expect(requestFingerprint(createImageRequest({ ...base, referenceImages: [{ data: new Uint8Array([1, 2, 4]) }] }))).to.not.equal(fp);
      expect(requestFingerprint(createImageRequest({ ...base, parameters: { n: 2 } }))).to.not.equal(fp);
    });

    it("takes the key from the idempotency-key header, which must match the request's", () => {
      const request = createImageRequest({ prompt: "p" });
      expect(withHeaderKey(request, new Headers({ "Idempotency-Key": "abc" })).idempotencyKey).to.equal("abc");
      expect(withHeaderKey(request, new Headers()).idempotencyKey).to.equal(undefined);
      const mismatch = expectThrow(() => withHeaderKey({ ...request, idempotencyKey: "x" }, new Headers({ "idempotency-key": "y" })));
      expect(mismatch.code).to.equal("invalid_request");
      const invalid = expectThrow(() => withHeaderKey(request, new Headers({ "idempotency-key": "a b" })));
      expect(invalid.code).to.equal("invalid_request");
    });
  });

  describe("over the network", function () {
    this.timeout(20_000);

    class CountingProvider extends FakeProvider {
      override descriptor() {
        return { ...super.descriptor(), name: "counting" };
      }
      override async capabilities() {
        return { ...(await super.capabilities()), provider: "counting" };
      }
    }

    it("a client that drops mid-flight and retries with the same key gets the first call's result: one provider call", async () => {
      const provider = new CountingProvider({ delayMs: 400 });
      const server = await startServer({
        modules: [defineImagesModule({ extraProviders: [provider] })],
        config: { images: { reference: { enabled: false } } },
      });
      try {
        const images = createClient(ImageService, server.transport);
        const request = { request: { prompt: "retry me", operation: { case: "generate" as const, value: {} } } };
        const headers = { "idempotency-key": "order-42" };
        const controller = new AbortController();
        const first = images.generate(request, { headers, signal: controller.signal });
        await eventually(async () => expect(provider.calls).to.equal(1));
        controller.abort();
        await expectRejection(first);

        let replayed: string | null = null;
        const retry = await images.generate(request, { headers, onHeader: (h) => (replayed = h.get("idempotency-replayed")) });
        expect(retry.response!.data).to.have.length(1);
        expect(replayed).to.equal("true");
        expect(provider.calls).to.equal(1);
        expect(provider.aborted).to.equal(0);

        // The same key with another request is refused.
        const conflict = await expectRejection<ConnectError>(
          images.generate({ request: { ...request.request, prompt: "another" } }, { headers }),
        );
        expect(conflict.code).to.equal(Code.AlreadyExists);

        // A stream with the key joins the stored result: started, then completed.
        const events: string[] = [];
        for await (const message of images.generateStream(request, { headers })) events.push(message.event.case ?? "");
        expect(events).to.deep.equal(["started", "completed"]);
        expect(provider.calls).to.equal(1);

        // The metrics say the same: one run, two answers from it (joined while it ran, or replayed), one conflict; one provider call timed.
        const registry = server.host.metrics.registry;
        const answered = (result: string) => metricValue(registry, "mmgate_images_idempotency_requests_total", { result });
        expect(await answered("executed")).to.equal(1);
        expect((await answered("joined")) + (await answered("replayed"))).to.equal(2);
        expect(await answered("conflict")).to.equal(1);
        expect(await metricValue(registry, "mmgate_images_provider_duration_seconds_count", { provider: "counting", outcome: "ok" })).to.equal(1);
      } finally {
        await server.close();
      }
    });
  });
});

