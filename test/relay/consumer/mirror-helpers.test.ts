import { expect } from "chai";
import { FilterUpdateKind } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { prng, producer, randomImages, snapshotUpdates } from "./mirror-helpers.js";

describe("relay consumer test builders", () => {
  it("builds a snapshot of ceil(B / 524,288) chunks at one sequence", () => {
    expect(snapshotUpdates(producer(), 3n, new BigUint64Array(16))).to.have.length(1);
    const updates = snapshotUpdates(producer({ bucketCount: 1 << 20 }), 3n, new BigUint64Array(1 << 20));
    expect(updates.map((u) => [u.baseSequence, u.sequence, u.kind])).to.deep.equal([
      [3n, 3n, FilterUpdateKind.SNAPSHOT_CHUNK],
      [3n, 3n, FilterUpdateKind.SNAPSHOT_CHUNK],
    ]);
  });

  it("random images never repeat a bucket", () => {
    const images = randomImages(prng(3), 16, 16);
    expect(new Set(images.map((i) => i.bucket)).size).to.equal(16);
  });
});
