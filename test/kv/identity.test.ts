import { expect } from "chai";
import {
  baseTarget,
  blockHashOptionsFor,
  canonicalModelId,
  computeBlockHashForSeq,
  computeSeqHashForBlock,
  createKvQuerySemantics,
  createRegistration,
  createRegistrationWithTarget,
  hashFormatIdentityVersion,
  isEagleHashFormat,
  KV_QUERY_HASH_FORMATS,
  KvHashError,
  kvQueryHashFormatFromEagle,
  loraTarget,
  modelAlias,
  parseKvQueryHashFormat,
  resolveRegistration,
  targetAdapter,
  type CanonicalModelRegistration,
  type KvHashErrorCode,
  type KvQueryHashFormat,
} from "../../src/kv/hash/index.js";

function expectCode(fn: () => unknown, code: KvHashErrorCode): void {
  expect(fn).to.throw(KvHashError).with.property("code", code);
}

const range = (n: number): number[] => Array.from({ length: n }, (_, i) => i);

/** A name for a test title, with anything outside printable ASCII escaped. */
function show(name: string): string {
  return JSON.stringify(name).replace(/[^\x20-\x7e]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

describe("KV model identity: names", () => {
  // U+FEFF is not Unicode White_Space, so Rust's trim (the reference's rule) keeps it; JavaScript's trim would not.
  const accepted = ["llama", "meta-llama/Llama-3.1-8B-Instruct", "tenant chat", "x", "\ufeffllama"];
  for (const name of accepted) {
    it(`accepts ${show(name)} as a model id and an alias`, () => {
      expect(canonicalModelId(name)).to.equal(name);
      expect(modelAlias(name)).to.equal(name);
    });
  }

  const refused: [string, KvHashErrorCode][] = [
    ["", "EMPTY_NAME"],
    [" llama", "SURROUNDING_WHITESPACE"],
    ["llama ", "SURROUNDING_WHITESPACE"],
    ["\tllama", "SURROUNDING_WHITESPACE"],
    ["llama\n", "SURROUNDING_WHITESPACE"],
    [" ", "SURROUNDING_WHITESPACE"],
    ["\u00a0llama", "SURROUNDING_WHITESPACE"],
    ["llama\u3000", "SURROUNDING_WHITESPACE"],
    ["\u0085llama", "SURROUNDING_WHITESPACE"],
  ];
  for (const [name, code] of refused) {
    it(`refuses ${show(name)} with ${code}`, () => {
      expectCode(() => canonicalModelId(name), code);
      expectCode(() => modelAlias(name), code);
    });
  }
});

describe("KV model identity: registrations", () => {
  const llama = canonicalModelId("llama");
  const tenantA = canonicalModelId("tenant-a");

  it("registers a base model under its own name as a base target", () => {
    const registration = createRegistration(llama);
    expect(registration.model).to.equal("llama");
    expect(registration.target).to.deep.equal({ kind: "base", baseModel: "llama" });
    expect(registration.aliases).to.deep.equal([]);
    expect(targetAdapter(registration.target)).to.equal(undefined);
  });

  it("registers a LoRA adapter on a base model", () => {
    const registration = createRegistrationWithTarget(tenantA, loraTarget(llama, tenantA), [modelAlias("tenant-chat")]);
    expect(registration.target).to.deep.equal({ kind: "lora", baseModel: "llama", adapter: "tenant-a" });
    expect(targetAdapter(registration.target)).to.equal("tenant-a");
    expect(registration.aliases).to.deep.equal(["tenant-chat"]);
  });

  it("drops a self-alias and repeats, and sorts aliases", () => {
    const registration = createRegistration(llama, ["chat", "llama", "chat", "assistant"].map(modelAlias));
    expect(registration.aliases).to.deep.equal(["assistant", "chat"]);
  });

  it("sorts aliases by code point (UTF-8 byte order), not UTF-16 code unit", () => {
    // U+1F999 is a surrogate pair in UTF-16 (0xD83E...) and would sort before U+FFFD there.
    const registration = createRegistration(llama, ["\u{1F999}", "\uFFFD", "b", "a"].map(modelAlias));
    expect(registration.aliases).to.deep.equal(["a", "b", "\uFFFD", "\u{1F999}"]);
  });

  it("freezes registrations and targets", () => {
    const registration = createRegistrationWithTarget(tenantA, loraTarget(llama, tenantA), [modelAlias("x")]);
    expect(Object.isFrozen(registration)).to.equal(true);
    expect(Object.isFrozen(registration.target)).to.equal(true);
    expect(Object.isFrozen(registration.aliases)).to.equal(true);
    expect(Object.isFrozen(baseTarget(llama))).to.equal(true);
  });

  it("does not change the alias list it is given", () => {
    const aliases = ["b", "a", "llama"].map(modelAlias);
    createRegistration(llama, aliases);
    expect(aliases).to.deep.equal(["b", "a", "llama"]);
  });
});

describe("KV model identity: resolving a requested model", () => {
  const llama = canonicalModelId("llama");
  const tenantA = canonicalModelId("tenant-a");
  const lora = createRegistrationWithTarget(tenantA, loraTarget(llama, tenantA), [modelAlias("tenant-chat")]);
  const base = createRegistration(llama, [modelAlias("llama-chat")]);
  const registrations = [lora, base];

  const cases: [string, CanonicalModelRegistration | undefined][] = [
    ["tenant-chat", lora],
    ["tenant-a", lora],
    ["llama", base],
    ["llama-chat", base],
    ["mistral", undefined],
    ["Tenant-Chat", undefined],
    [" tenant-chat", undefined],
    ["", undefined],
  ];
  for (const [requested, want] of cases) {
    it(`resolves ${JSON.stringify(requested)} to ${want === undefined ? "nothing" : want.model}`, () => {
      expect(resolveRegistration(registrations, requested)).to.equal(want);
    });
  }

  it("prefers a model's own name over another registration's alias, wherever it is listed", () => {
    const shadowing = createRegistration(canonicalModelId("other"), [modelAlias("llama")]);
    expect(resolveRegistration([shadowing, base], "llama")).to.equal(base);
    expect(resolveRegistration([shadowing], "llama")).to.equal(shadowing);
  });

  it("resolves nothing from no registrations", () => {
    expect(resolveRegistration([], "llama")).to.equal(undefined);
  });
});

describe("KV query semantics", () => {
  it("validates and describes the two formats", () => {
    const standard = createKvQuerySemantics(4, "DYNAMO_STANDARD_V1");
    expect(standard).to.deep.equal({ kvBlockSize: 4, hashFormat: "DYNAMO_STANDARD_V1", isEagle: false });
    const eagle = createKvQuerySemantics(16, "DYNAMO_EAGLE_V1");
    expect(eagle).to.deep.equal({ kvBlockSize: 16, hashFormat: "DYNAMO_EAGLE_V1", isEagle: true });
    expect(Object.isFrozen(eagle)).to.equal(true);
    expect(createKvQuerySemantics(2 ** 32 - 1, "DYNAMO_STANDARD_V1").kvBlockSize).to.equal(2 ** 32 - 1);
  });

  const formats: [KvQueryHashFormat, boolean, number][] = [
    ["DYNAMO_STANDARD_V1", false, 1],
    ["DYNAMO_EAGLE_V1", true, 2],
  ];
  for (const [format, eagle, version] of formats) {
    it(`knows ${format}: Eagle ${eagle}, identity version ${version}`, () => {
      expect(isEagleHashFormat(format)).to.equal(eagle);
      expect(hashFormatIdentityVersion(format)).to.equal(version);
      expect(kvQueryHashFormatFromEagle(eagle)).to.equal(format);
      expect(parseKvQueryHashFormat(format)).to.equal(format);
    });
  }

  it("lists exactly the two formats", () => {
    expect(KV_QUERY_HASH_FORMATS).to.deep.equal(["DYNAMO_STANDARD_V1", "DYNAMO_EAGLE_V1"]);
  });

  it("refuses block size 0 with ZERO_BLOCK_SIZE", () => {
    expectCode(() => createKvQuerySemantics(0, "DYNAMO_STANDARD_V1"), "ZERO_BLOCK_SIZE");
  });

  for (const bad of [-1, 1.5, Number.NaN, 2 ** 32]) {
    it(`refuses block size ${bad} with INVALID_BLOCK_SIZE`, () => {
      expectCode(() => createKvQuerySemantics(bad, "DYNAMO_STANDARD_V1"), "INVALID_BLOCK_SIZE");
    });
  }

  for (const bad of ["", "UNSPECIFIED", "KV_QUERY_HASH_FORMAT_UNSPECIFIED", "dynamo_standard_v1", "DYNAMO_STANDARD_V2"]) {
    it(`refuses hash format ${JSON.stringify(bad)} with UNKNOWN_HASH_FORMAT`, () => {
      expectCode(() => parseKvQueryHashFormat(bad), "UNKNOWN_HASH_FORMAT");
      expectCode(() => createKvQuerySemantics(4, bad as KvQueryHashFormat), "UNKNOWN_HASH_FORMAT");
    });
  }
});

describe("KV model identity: block-hash options for a request", () => {
  const llama = canonicalModelId("llama");
  const tenantA = canonicalModelId("tenant-a");

  /** The seed's scenario: "tenant-a" as a LoRA on "llama", reached through the alias "tenant-chat"; or the base "llama". */
  function scenario(viaLoraAlias: boolean): { registrations: CanonicalModelRegistration[]; requested: string } {
    const registration = viaLoraAlias
      ? createRegistrationWithTarget(tenantA, loraTarget(llama, tenantA), [modelAlias("tenant-chat")])
      : createRegistration(llama);
    return { registrations: [registration], requested: viaLoraAlias ? "tenant-chat" : "llama" };
  }

  for (const format of KV_QUERY_HASH_FORMATS) {
    const semantics = createKvQuerySemantics(4, format);
    const isEagle = format === "DYNAMO_EAGLE_V1";

    it(`${format}: salts a request for the alias "tenant-chat" with the canonical adapter "tenant-a"`, () => {
      const { registrations, requested } = scenario(true);
      const registration = resolveRegistration(registrations, requested)!;
      const options = blockHashOptionsFor(registration, semantics, "tenant-ns");
      expect(options).to.deep.equal({ loraName: "tenant-a", cacheNamespace: "tenant-ns", isEagle });
      const tokens = range(21);
      const hashes = computeBlockHashForSeq(tokens, semantics.kvBlockSize, options);
      expect(hashes).to.deep.equal(computeBlockHashForSeq(tokens, 4, { loraName: "tenant-a", cacheNamespace: "tenant-ns", isEagle }));
      expect(hashes).not.to.deep.equal(computeBlockHashForSeq(tokens, 4, { loraName: "tenant-chat", cacheNamespace: "tenant-ns", isEagle }));
      expect(hashes).not.to.deep.equal(computeBlockHashForSeq(tokens, 4, { cacheNamespace: "tenant-ns", isEagle }));
    });

    it(`${format}: leaves a base-model request unsalted but for its namespace`, () => {
      const { registrations, requested } = scenario(false);
      const registration = resolveRegistration(registrations, requested)!;
      expect(blockHashOptionsFor(registration, semantics, "tenant-ns")).to.deep.equal({ loraName: undefined, cacheNamespace: "tenant-ns", isEagle });
      expect(blockHashOptionsFor(registration, semantics)).to.deep.equal({ loraName: undefined, cacheNamespace: undefined, isEagle });
      const tokens = range(21);
      expect(computeBlockHashForSeq(tokens, 4, blockHashOptionsFor(registration, semantics))).to.deep.equal(computeBlockHashForSeq(tokens, 4, { isEagle }));
    });

    for (const viaLoraAlias of [false, true]) {
      it(`${format}, ${viaLoraAlias ? "LoRA via alias" : "base"}: the hashes of 13 tokens are a strict prefix of those of 21 tokens at block size 4`, () => {
        const { registrations, requested } = scenario(viaLoraAlias);
        const options = blockHashOptionsFor(resolveRegistration(registrations, requested)!, semantics, "tenant-ns");
        const initial = computeBlockHashForSeq(range(13), semantics.kvBlockSize, options);
        const expanded = computeBlockHashForSeq(range(21), semantics.kvBlockSize, options);
        expect(initial).to.have.length(3); // 13 / 4, or (13 - 1) / 4 for Eagle
        expect(expanded).to.have.length(5); // 21 / 4, or (21 - 1) / 4 for Eagle
        expect(expanded.slice(0, initial.length)).to.deep.equal(initial);
        const initialSeq = computeSeqHashForBlock(initial);
        const expandedSeq = computeSeqHashForBlock(expanded);
        expect(expandedSeq.slice(0, initialSeq.length)).to.deep.equal(initialSeq);
      });
    }
  }

  it("keeps the standard and Eagle spaces apart for the same request", () => {
    const registration = scenario(true).registrations[0]!;
    const standard = computeBlockHashForSeq(range(21), 4, blockHashOptionsFor(registration, createKvQuerySemantics(4, "DYNAMO_STANDARD_V1")));
    const eagle = computeBlockHashForSeq(range(21), 4, blockHashOptionsFor(registration, createKvQuerySemantics(4, "DYNAMO_EAGLE_V1")));
    expect(eagle[0]).not.to.equal(standard[0]);
  });

  it("salts with the target's adapter even when the registration's own name differs from it", () => {
    const registration = createRegistrationWithTarget(canonicalModelId("tenant-a-chat"), loraTarget(llama, canonicalModelId("tenant-a-v2")), [
      modelAlias("chat"),
    ]);
    const resolved = resolveRegistration([registration], "chat")!;
    const semantics = createKvQuerySemantics(4, "DYNAMO_STANDARD_V1");
    expect(blockHashOptionsFor(resolved, semantics).loraName).to.equal("tenant-a-v2");
  });
});
