import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { Health, HealthCheckResponse_ServingStatus as S } from "../../gen/grpc/health/v1/health_pb.js";
import { ChannelPool, channelDefaults, createChannel, type Channel, type ChannelFactory } from "../../src/rpc/index.js";
import type { InProcessServer } from "../support/server.js";
import { startServer } from "../support/server.js";

/** A factory that records what it built and lets each channel's close() be finished by hand. */
function recordingFactory() {
  const built: { target: string; closes: number; finish: () => void }[] = [];
  const factory: ChannelFactory = (target) => {
    let finish!: () => void;
    const done = new Promise<void>((resolve) => (finish = resolve));
    const entry = { target, closes: 0, finish };
    built.push(entry);
    let closed = false;
    const channel: Channel = {
      target,
      inFlight: 0,
      get closed() {
        return closed;
      },
      unary: () => Promise.reject(new Error("not used")),
      stream: () => Promise.reject(new Error("not used")),
      close() {
        closed = true;
        entry.closes++;
        return done;
      },
      abort() {
        closed = true;
        finish();
      },
    };
    return channel;
  };
  return { built, factory };
}

describe("rpc: ChannelPool", () => {
  it("creates one channel per target, lazily", () => {
    const { built, factory } = recordingFactory();
    const pool = new ChannelPool(channelDefaults, {}, factory);
    expect(built).to.have.length(0);
    const a = pool.get("10.0.0.1:1");
    expect(pool.get("10.0.0.1:1")).to.equal(a);
    pool.get("10.0.0.2:1");
    expect(built.map((b) => b.target)).to.deep.equal(["10.0.0.1:1", "10.0.0.2:1"]);
    expect(pool.targets()).to.deep.equal(["10.0.0.1:1", "10.0.0.2:1"]);
  });

  it("closes and forgets the channels of targets that left; a target that returns gets a new channel", () => {
    const { built, factory } = recordingFactory();
    const pool = new ChannelPool(channelDefaults, {}, factory);
    const a = pool.get("a:1");
    pool.get("b:1");
    pool.get("c:1");
    pool.retain(["b:1", "d:1"]);
    expect(pool.targets()).to.deep.equal(["b:1"]);
    expect(built.map((b) => [b.target, b.closes])).to.deep.equal([["a:1", 1], ["b:1", 0], ["c:1", 1]]);
    expect(pool.delete("b:1")).to.equal(true);
    expect(pool.delete("b:1")).to.equal(false);
    const again = pool.get("a:1");
    expect(again).to.not.equal(a);
    expect(a.closed).to.equal(true);
  });

  it("close() waits for the channels still draining, and get() throws afterwards", async () => {
    const { built, factory } = recordingFactory();
    const pool = new ChannelPool(channelDefaults, {}, factory);
    pool.get("a:1");
    pool.get("b:1");
    pool.delete("a:1");
    let closed = false;
    const closing = pool.close().then(() => (closed = true));
    await new Promise((r) => setImmediate(r));
    expect(closed).to.equal(false);
    for (const b of built) b.finish();
    await closing;
    expect(() => pool.get("a:1")).to.throw(/closed/);
  });

  describe("with real channels", () => {
    let server: InProcessServer;
    before(async () => {
      server = await startServer();
    });
    after(() => server.close());

    it("serves calls on a target's channel until the target leaves, then refuses them", async () => {
      const pool = new ChannelPool(channelDefaults, {}, createChannel);
      const channel = pool.get(server.addr);
      expect((await createClient(Health, channel).check({ service: "" })).status).to.equal(S.SERVING);
      pool.retain([]);
      const err = await createClient(Health, channel)
        .check({ service: "" })
        .catch((e: unknown) => ConnectError.from(e));
      expect((err as ConnectError).code).to.equal(Code.Unavailable);
      await pool.close();
    });
  });
});
