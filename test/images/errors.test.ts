import { expect } from "chai";
import { imagesConfigSchema } from "../../src/images/config.js";
import { ERROR_CODES, ImageError, toImageError } from "../../src/images/core/errors.js";

/** Whether `path` (`images.a.b`, `images.list[].key`) names a key of the images config. */
function isConfigKey(config: unknown, path: string): boolean {
  let node: unknown = { images: config };
  for (const part of path.split(".")) {
    const list = part.endsWith("[]");
    const key = list ? part.slice(0, -2) : part;
    if (typeof node !== "object" || node === null || !(key in node)) return false;
    node = (node as Record<string, unknown>)[key];
    if (list) {
      if (!Array.isArray(node) || node.length === 0) return false;
      node = node[0];
    }
  }
  return true;
}

describe("images: errors", () => {
  it("suggests only configuration keys that exist", () => {
    // One OpenAI entry, so that list keys can be checked too.
    const config = imagesConfigSchema.parse({ openai: [{ name: "openai", baseUrl: "https://api.example.com" }] });
    const named: string[] = [];
    for (const code of ERROR_CODES) {
      for (const suggestion of new ImageError(code, "m").suggestions) {
        for (const [path] of suggestion.matchAll(/\bimages(?:\.[A-Za-z]+(?:\[\])?)+/g)) named.push(path);
      }
    }
    expect(named).to.not.be.empty;
    for (const path of named) expect(isConfigKey(config, path), path).to.equal(true);
  });

  it("keeps what was thrown as the cause of an internal error, out of its text", () => {
    const bug = new TypeError("x is undefined");
    const error = toImageError(bug);
    expect([error.code, error.message]).to.deep.equal(["internal", "unexpected failure"]);
    expect(error.cause).to.equal(bug);
    expect(JSON.stringify(error.toJSON())).to.not.include("x is undefined");
    expect(error.withDetail("k", 1).cause).to.equal(bug);
  });
});
