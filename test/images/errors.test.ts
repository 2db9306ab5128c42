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

  it("never makes an unknown outcome retryable, however the error is built", () => {
    const unknown = new ImageError("upstream", "m", { retryable: true, details: { outcome: "unknown" } });
    expect(unknown.retryable).to.equal(false);
    expect(unknown.withRetryable(true).retryable).to.equal(false);
    expect(new ImageError("timeout", "m", { retryable: true }).withDetail("outcome", "unknown").retryable).to.equal(false);
    // A known outcome keeps what the builder said.
    expect(new ImageError("upstream", "m", { retryable: true, details: { outcome: "completed_unreplayable" } }).retryable).to.equal(true);
    expect(new ImageError("overloaded", "m", { retryable: true }).retryable).to.equal(true);
  });

  it("freezes the details, so nothing can change an error after it is built", () => {
    const error = new ImageError("upstream", "m", { retryable: true });
    expect(() => {
      (error.details as Record<string, unknown>)["outcome"] = "unknown";
    }).to.throw(TypeError);
    expect(error.retryable).to.equal(true);
  });

  it("gives every safety refusal its four safety details, and never makes it retryable", () => {
    const bare = new ImageError("safety_rejected", "refused", { retryable: true });
    expect(bare.retryable).to.equal(false);
    expect(bare.details).to.deep.equal({
      safety_category: "content_policy",
      recovery: "revise_prompt_or_inputs",
      retry_same_request: false,
      safety_controls_relaxed: false,
    });
    // A provider may name a finer category and recovery; the two flags are not its to set.
    const refined = new ImageError("safety_rejected", "refused", {
      details: { safety_category: "input_image", recovery: "replace_input_image", retry_same_request: true, safety_controls_relaxed: true, upstream_code: "x" },
    });
    expect(refined.details).to.deep.equal({
      safety_category: "input_image",
      recovery: "replace_input_image",
      retry_same_request: false,
      safety_controls_relaxed: false,
      upstream_code: "x",
    });
    expect(refined.withDetail("retry_same_request", true).details["retry_same_request"]).to.equal(false);
    // Other codes get no safety details.
    expect(new ImageError("invalid_request", "m").details).to.deep.equal({});
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
