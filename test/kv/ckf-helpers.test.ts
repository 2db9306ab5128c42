import { expect } from "chai";
import { computeNextSeqHash } from "../../src/kv/hash/index.js";
import { chain, external } from "./ckf-helpers.js";

describe("CKF test helpers", () => {
  it("external() is a per-member bijection of canonical hashes", () => {
    expect(external(external(42n, 1n, 0), 1n, 0)).to.equal(42n);
    expect(external(42n, 1n, 0)).not.to.equal(external(42n, 1n, 1));
    expect(external(42n, 1n, 0)).not.to.equal(external(42n, 2n, 0));
  });

  it("chain() roots at the tokens hash and chains the rest", () => {
    const [root, child] = chain([7n, 8n]);
    expect(root).to.equal(7n);
    expect(child).to.equal(computeNextSeqHash(7n, 8n));
    expect(chain([8n], 7n)).to.deep.equal([child]);
  });
});
