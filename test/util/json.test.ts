import { expect } from "chai";
import { JsonError, parseJson, stringifyJson } from "../../src/util/index.js";

function code(f: () => unknown): { code: string; path: string } {
  try {
    f();
  } catch (e) {
    expect(e).to.be.instanceOf(JsonError);
    const err = e as JsonError;
    return { code: err.code, path: err.path };
  }
  throw new Error("expected an JsonError");
}

describe("llm: lossless JSON", () => {
  it("keeps integers above 2^53 exact as bigint and small ones as number", () => {
    const v = parseJson('{"a":18446744073709551615,"b":9007199254740993,"c":-9223372036854775808,"d":42,"e":1.5,"f":1e3}');
    expect(v).to.deep.equal({ a: 18446744073709551615n, b: 9007199254740993n, c: -9223372036854775808n, d: 42, e: 1.5, f: 1000 });
    expect(stringifyJson(v)).to.equal('{"a":18446744073709551615,"b":9007199254740993,"c":-9223372036854775808,"d":42,"e":1.5,"f":1000}');
  });

  it("reads strings with escapes and surrogate pairs", () => {
    expect(parseJson('"a\\"b\\\\\\/\\n\\u00e9\\ud83d\\ude00"')).to.equal('a"b\\/\né😀');
  });

  it("treats __proto__ as a plain key", () => {
    const v = parseJson('{"__proto__":{"x":1}}') as Record<string, unknown>;
    expect(Object.keys(v)).to.deep.equal(["__proto__"]);
    expect(({} as Record<string, unknown>)["x"]).to.equal(undefined);
  });

  const bad: [string, string, string][] = [
    ["{", "SYNTAX", "$"],
    ['{"a":1,}', "SYNTAX", "$"],
    ["[1,2", "SYNTAX", "$"],
    ["01", "SYNTAX", "$"],
    ["1 2", "SYNTAX", "$"],
    ['{"a":[1,{"b":tru}]}', "SYNTAX", "$.a[1].b"],
    ['"\\x"', "SYNTAX", "$"],
    ['"a\nb"', "SYNTAX", "$"],
    ['{"a":1,"a":2}', "DUPLICATE_KEY", "$.a"],
    ['{"a":1e400}', "RANGE", "$.a"],
  ];
  for (const [text, want, path] of bad) {
    it(`rejects ${JSON.stringify(text)} with ${want} at ${path}`, () => {
      expect(code(() => parseJson(text))).to.deep.equal({ code: want, path });
    });
  }

  it("enforces the byte limit before parsing", () => {
    expect(code(() => parseJson('"ééé"', { maxBytes: 6, maxDepth: 8 }))).to.deep.equal({ code: "TOO_LARGE", path: "$" });
    expect(parseJson('"éé"', { maxBytes: 6, maxDepth: 8 })).to.equal("éé");
  });

  it("enforces the depth limit", () => {
    expect(parseJson("[[[]]]", { maxBytes: 100, maxDepth: 3 })).to.deep.equal([[[]]]);
    expect(code(() => parseJson('{"a":[[[]]]}', { maxBytes: 100, maxDepth: 3 }))).to.deep.equal({ code: "TOO_DEEP", path: "$.a[0][0]" });
    expect(code(() => parseJson("[".repeat(100_000), { maxBytes: 1 << 20, maxDepth: 128 })).code).to.equal("TOO_DEEP");
  });
});
