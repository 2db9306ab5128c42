import { expect } from "chai";
import { indentJson } from "../../src/console/web/json-text.js";

describe("console: the descriptor JSON re-indented as text", () => {
  it("indents objects, keeps lists of scalars on one line, and never rounds a u64", () => {
    const text = '{"addr":18446744073709551615,"shape":[2,3,3],"meta":{"Video":{"ts":[0.0,1.5]}},"empty":[],"none":{}}';
    expect(indentJson(text)).to.equal(
      [
        "{",
        '  "addr": 18446744073709551615,',
        '  "shape": [2, 3, 3],',
        '  "meta": {',
        '    "Video": {',
        '      "ts": [0.0, 1.5]',
        "    }",
        "  },",
        '  "empty": [],',
        '  "none": {}',
        "}",
      ].join("\n"),
    );
  });

  it("leaves strings alone: brackets, commas, colons and escaped quotes inside them", () => {
    expect(indentJson('{"a":"x,{[:]}\\"y","b":["p,q","]"]}')).to.equal(['{', '  "a": "x,{[:]}\\"y",', '  "b": ["p,q", "]"]', "}"].join("\n"));
  });
});
