import { throttledBootstrap } from "./throttled-bootstrap.js";

/**
 * A 2^21-bucket lane (four 4 MiB chunks) at 8 MB/s under a 1 s progress
 * timeout: each chunk about 0.52 s, the whole snapshot about 2.1 s, twice
 * the timeout. The e2e suite's scenario 8 runs the same lane at 1 MB/s under
 * 5 s, through a router process (test/e2e/throttled-router.ts).
 */
describe("relay pool stream over a throttled link", () => {
  it("a subscriber bootstrapping a lane that takes longer than the progress timeout to send completes (the timeout is per chunk), then gets a delta", async function () {
    this.timeout(60_000);
    await throttledBootstrap({ buckets: 1 << 21, bytesPerSecond: 8_000_000, snapshotProgressTimeoutMs: 1_000 });
  });
});
