/**
 * Access control with named keys and scopes: the scope rules (levels that
 * imply each other, service and method scopes, short and full names), the
 * keys file's validation, expiry, certificate rules, and reloads of the
 * file (a good one swaps the keys at once, a bad one keeps them and says
 * why). test/server/auth-network.test.ts calls a real server.
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { PeerCertificate } from "node:tls";
import type { DescMethod } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { expect } from "chai";
import { pino } from "pino";
import { Registry } from "prom-client";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { EncodeHopService } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import { MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import {
  AccessControl,
  certificateRulesSchema,
  compileCertificateRules,
  KeySet,
  KeysFileError,
  keyDigest,
  kebabServiceName,
  parseAltNames,
  parseKeysText,
  SERVICE_SCOPES,
  serviceScope,
  methodScope,
  type Verdict,
} from "../../src/server/access/index.js";
import { ConfigError, resolveConfig } from "../../src/server/index.js";
import { parseDescriptorImage } from "../../src/server/reflection-image.js";
import { eventually, expectThrown, metricValue, repoRoot } from "../support/index.js";

const { method: admin } = AdminService;
const { method: images } = ImageService;

/** A keys file entry for `key`. */
function entry(name: string, key: string, scopes: string[], extra: Record<string, unknown> = {}) {
  return { name, sha256: keyDigest(key), scopes, ...extra };
}

function yamlOf(keys: object[]): string {
  return JSON.stringify({ keys }, null, 2);
}

/** Log lines written through pino, parsed. */
function capturingLogger(lines: Record<string, unknown>[]) {
  return pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
}

describe("auth: keys and scopes", function () {
  this.timeout(20_000);
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "mmgate-auth-keys-"));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  /** An AccessControl over a keys file holding `keys`, with auth settings merged in. */
  async function controlOf(keys: object[], auth: Record<string, unknown> = {}, options: { now?: () => number; lines?: Record<string, unknown>[] } = {}) {
    const file = join(dir, `keys-${Math.random().toString(36).slice(2)}.yaml`);
    await writeFile(file, yamlOf(keys));
    const config = resolveConfig({ auth: { keysFile: file, ...auth } }, []);
    const registry = new Registry();
    const control = new AccessControl({
      auth: config.auth,
      logger: options.lines ? capturingLogger(options.lines) : pino({ level: "silent" }),
      registry,
      ...(options.now ? { now: options.now } : {}),
      watch: { debounceMs: 20, pollMs: 50 },
    });
    return { control, file, registry };
  }

  describe("service scopes", () => {
    /** The rule SERVICE_SCOPES follows (scopes.ts): the package's name, or the kebab-case service name where that name is shared. */
    function derive(typeNames: readonly string[]): Map<string, string> {
      const packageName = (t: string) => t.split(".").slice(0, -1).filter((p) => !/^v\d+((alpha|beta)\d*)?$/.test(p)).at(-1)!;
      const logical = (t: string) => t.split(".").filter((p) => !/^v\d+((alpha|beta)\d*)?$/.test(p)).join(".");
      const owners = new Map<string, Set<string>>();
      for (const t of typeNames) owners.set(packageName(t), (owners.get(packageName(t)) ?? new Set()).add(logical(t)));
      return new Map(typeNames.map((t) => [t, owners.get(packageName(t))!.size > 1 ? kebabServiceName(t) : packageName(t)]));
    }

    const protoServices = [...parseDescriptorImage(readFileSync(join(repoRoot, "gen", "descriptors.binpb"))).values()].flatMap((f) =>
      f.service.map((s) => `${f.package}.${s.name}`),
    );

    it("names every service of proto/, by the rule, one name per service (its versions sharing it)", () => {
      expect([...SERVICE_SCOPES.keys()].sort()).to.deep.equal([...protoServices].sort());
      expect(Object.fromEntries(SERVICE_SCOPES)).to.deep.equal(Object.fromEntries(derive(protoServices)));
      const byName = new Map<string, string>();
      for (const [service, name] of SERVICE_SCOPES) {
        const logical = service.replace(/\.v\d+\w*\./, ".");
        expect(byName.get(name) ?? logical, `${name} names one service`).to.equal(logical);
        byName.set(name, logical);
      }
    });

    const names: [string, string, string][] = [
      ["mmgate.images.v1.ImageService", "Generate", "images.generate"],
      ["mmgate.images.v1.ImageService", "GenerateStream", "images.generateStream"],
      ["mmgate.admin.v1.AdminService", "SetServingStatus", "admin.setServingStatus"],
      ["mmgate.encode.v1.EncodeHopService", "Generate", "encode-hop.generate"],
      ["mmgate.llm.v1.TokenWorkerService", "Generate", "llm.generate"],
      ["dynamo.kvrelay.v1.KvEventRelay", "SubscribeKvPool", "kv-event-relay.subscribeKvPool"],
      // A service outside proto/ (a test's, a plugin's): its own name in kebab case.
      ["test.shapes.v1.ShapesService", "Draw", "shapes.draw"],
      ["acme.v1.HTTPGatewayService", "Do", "http-gateway.do"],
    ];
    for (const [service, method, scope] of names) {
      it(`${service}/${method} → ${scope}`, () => expect(methodScope(service, method)).to.equal(scope));
    }
    it("a service scope is the method scope's first part", () => expect(serviceScope("mmgate.media.v1.MediaService")).to.equal("media"));
  });

  describe("which scopes grant which methods", () => {
    const KEY = "k-0123456789abcdef-scopes";
    // [scopes, method, granted (or the scope the refusal names)]
    const cases: [string[], DescMethod, true | string][] = [
      [["mutating"], images.generate, true],
      [["mutating"], admin.drain, "admin"],
      [["mutating"], admin.setServingStatus, true],
      [["public"], images.generate, "mutating"],
      [["admin"], images.generate, true],
      [["admin"], admin.drain, true],
      [["images"], images.generate, true],
      [["images"], images.generateStream, true],
      [["images"], MediaService.method.releaseTensor, "mutating"],
      [["images.generate"], images.generate, true],
      [["images.generate"], images.generateStream, "mutating"],
      [["Images.Generate"], images.generate, true],
      [["images.generateStream"], images.generateStream, true],
      [["mmgate.images.v1.ImageService/Generate"], images.generate, true],
      [["mmgate.images.v1.ImageService/Generate"], images.generateStream, "mutating"],
      [["mmgate.images.v1.ImageService"], images.generateStream, true],
      [["admin.getConfig"], admin.getConfig, true],
      [["admin.getConfig"], admin.drain, "admin"],
      [["admin.getConfig"], admin.setServingStatus, "mutating"],
      [["media.releaseTensor"], MediaService.method.releaseTensor, true],
      [["encode-hop"], EncodeHopService.method.generate, true],
      [["encode-hop.generate", "images"], images.generate, true],
      // A public method is open whatever the scopes.
      [["images.generate"], admin.getStatus, true],
    ];
    for (const [scopes, method, expected] of cases) {
      const path = `${method.parent.typeName}/${method.name}`;
      it(`${scopes.join(", ")} → ${path}: ${expected === true ? "granted" : `PERMISSION_DENIED, lacks ${expected}`}`, async () => {
        const { control } = await controlOf([entry("k", KEY, scopes)]);
        const verdict = control.authorize(method, `Bearer ${KEY}`, undefined);
        expect(verdict.caller?.name).to.equal("k");
        if (expected === true) {
          expect(verdict.refusal).to.equal(undefined);
        } else {
          expect(verdict.refusal?.code).to.equal(Code.PermissionDenied);
          expect(verdict.refusal?.rawMessage).to.match(new RegExp(`^key k lacks scope ${expected} for ${path} \\(`));
          expect(verdict.refusal?.rawMessage).to.not.include(KEY);
        }
      });
    }

    it("gives the caller its scopes with the levels they imply, and its limits", async () => {
      const { control } = await controlOf([entry("k", KEY, ["admin", "images.generate"], { limits: { requestsPerSecond: 2, imagesPerMinute: 30 } })]);
      const { caller } = control.authorize(images.generate, `Bearer ${KEY}`, undefined);
      expect([...caller!.scopes].sort()).to.deep.equal(["admin", "images.generate", "mutating", "public"]);
      expect(caller).to.deep.include({ name: "k", via: "key", limits: { requestsPerSecond: 2, imagesPerMinute: 30 } });
    });
  });

  describe("credentials", () => {
    const GOOD = "good-key-0123456789abcdef";
    const OLD = "old-key-0123456789abcdef";
    const EXPIRES = "2030-01-01T00:00:00Z";
    const at = Date.parse(EXPIRES);
    let now = at - 1;
    let control: AccessControl;
    before(async () => {
      ({ control } = await controlOf([entry("good", GOOD, ["mutating"]), entry("old", OLD, ["mutating"], { expires: EXPIRES })], {}, { now: () => now }));
    });

    // [authorization header, verdict on a MUTATING method, on a PUBLIC one]
    const cases: [string | null, RegExp | string, string | undefined][] = [
      [null, /^mmgate.images.v1.ImageService\/Generate requires a bearer token$/, undefined],
      ["Basic Z29vZA==", /requires a bearer token$/, undefined],
      ["Bearer", /requires a bearer token$/, undefined],
      ["Bearer not-a-key-0123456789", /^invalid bearer token$/, undefined],
      [`Bearer ${GOOD}`, "good", "good"],
      [`bearer   ${GOOD}  `, "good", "good"],
    ];
    for (const [header, mutating, open] of cases) {
      it(`authorization ${JSON.stringify(header)}: ${String(mutating)} on Generate, ${open ?? "anonymous"} on GetStatus`, () => {
        const verdict = control.authorize(images.generate, header, undefined);
        if (typeof mutating === "string") {
          expect(verdict.refusal).to.equal(undefined);
          expect(verdict.caller?.name).to.equal(mutating);
        } else {
          expect(verdict.refusal?.code).to.equal(Code.Unauthenticated);
          expect(verdict.refusal?.rawMessage).to.match(mutating);
          expect(verdict.caller).to.equal(undefined);
        }
        expect(control.authorize(admin.getStatus, header, undefined)).to.deep.equal(open === undefined ? {} : { caller: verdict.caller });
      });
    }

    it("refuses an expired key by name (never the key), from its expiry on; on a public method it is anonymous", () => {
      now = at - 1;
      expect(control.authorize(images.generate, `Bearer ${OLD}`, undefined).caller?.name).to.equal("old");
      now = at;
      const verdict = control.authorize(images.generate, `Bearer ${OLD}`, undefined);
      expect(verdict.refusal).to.be.instanceOf(ConnectError);
      expect(verdict.refusal).to.deep.include({ code: Code.Unauthenticated, rawMessage: "key old expired" });
      expect(control.authorize(admin.getStatus, `Bearer ${OLD}`, undefined)).to.deep.equal({});
      expect(control.authorize(images.generate, `Bearer ${GOOD}`, undefined).caller?.name).to.equal("good");
    });

    it("auth.token is the key token with every scope, beside the file's keys", async () => {
      const token = "the-server-token-0123456789";
      const { control: both } = await controlOf([entry("ci", GOOD, ["images.generate"])], { token });
      const verdict = both.authorize(admin.drain, `Bearer ${token}`, undefined);
      expect(verdict.refusal).to.equal(undefined);
      expect(verdict.caller).to.deep.include({ name: "token", via: "token" });
      expect([...verdict.caller!.scopes].sort()).to.deep.equal(["admin", "mutating", "public"]);
      expect(both.authorize(images.generate, `Bearer ${GOOD}`, undefined).caller?.name).to.equal("ci");
      expect(both.current.keyCount).to.equal(2);
    });

    it("labels metrics with the set's names only: anonymous without a caller, other for anything else", () => {
      expect(control.callerLabel(undefined)).to.equal("anonymous");
      expect(control.callerLabel("good")).to.equal("good");
      expect(control.callerLabel("someone")).to.equal("other");
    });
  });

  describe("the keys file", () => {
    const digest = keyDigest("some-key-0123456789abcdef");
    // [what, text, code, what the problems say]
    const bad: [string, string, string, RegExp][] = [
      ["an empty file", "", "empty", /the file is empty/],
      ["comments only", "# nothing yet\n", "empty", /holds no document/],
      ["not YAML", "keys: [\n", "parse", /not valid YAML/],
      ["no keys list", "{}", "invalid", /^keys: /],
      ["an unknown field", `keys:\n  - { name: a, sha256: ${digest}, scopes: [admin], role: x }\n`, "invalid", /keys\[0\]: Unrecognized key: "role"/],
      ["the key instead of its digest", "keys:\n  - { name: a, sha256: my-secret-key, scopes: [admin] }\n", "invalid", /keys\[0\]\.sha256: expected the key's SHA-256 as 64 hex digits/],
      ["no scopes", `keys:\n  - { name: a, sha256: ${digest}, scopes: [] }\n`, "invalid", /keys\[0\]\.scopes: give at least one scope/],
      ["a scope that cannot be one", `keys:\n  - { name: a, sha256: ${digest}, scopes: ["images generate"] }\n`, "invalid", /keys\[0\]\.scopes\[0\]: expected an access level/],
      ["a name with a space", `keys:\n  - { name: "a b", sha256: ${digest}, scopes: [admin] }\n`, "invalid", /keys\[0\]\.name: a name is 1 to 64/],
      ["a name too long", `keys:\n  - { name: ${"a".repeat(65)}, sha256: ${digest}, scopes: [admin] }\n`, "invalid", /keys\[0\]\.name/],
      ["a reserved name", `keys:\n  - { name: Anonymous, sha256: ${digest}, scopes: [admin] }\n`, "invalid", /keys\[0\]\.name: "Anonymous" is reserved/],
      ["an expiry without a zone", `keys:\n  - { name: a, sha256: ${digest}, scopes: [admin], expires: "2030-01-01T00:00:00" }\n`, "invalid", /keys\[0\]\.expires: expected an RFC 3339 time/],
      ["a limit of zero", `keys:\n  - { name: a, sha256: ${digest}, scopes: [admin], limits: { imagesPerMinute: 0 } }\n`, "invalid", /keys\[0\]\.limits\.imagesPerMinute/],
      [
        "a duplicate name (case aside)",
        `keys:\n  - { name: ci, sha256: ${digest}, scopes: [admin] }\n  - { name: CI, sha256: ${keyDigest("another-key-0123456789")}, scopes: [admin] }\n`,
        "invalid",
        /keys\[1\]\.name: duplicate name: entry 0 has it too/,
      ],
      [
        "a duplicate digest",
        `keys:\n  - { name: a, sha256: ${digest}, scopes: [admin] }\n  - { name: b, sha256: ${digest.toUpperCase()}, scopes: [public] }\n`,
        "invalid",
        /keys\[1\]\.sha256: duplicate digest: entry 0 has it too/,
      ],
    ];
    for (const [what, text, code, problems] of bad) {
      it(`refuses ${what} (${code})`, () => {
        const err = expectThrown<KeysFileError>(() => parseKeysText(text, "keys.yaml"), { type: KeysFileError, code });
        expect(err.problems.join("\n")).to.match(problems);
      });
    }

    it("reads YAML and JSON alike, digests lower-cased, an empty list as no keys", () => {
      const yaml = `keys:\n  - name: ci\n    sha256: ${digest.toUpperCase()}\n    scopes: [images.generate, media]\n    expires: 2030-01-01T00:00:00+02:00\n`;
      expect(parseKeysText(yaml, "k.yaml")).to.deep.equal([{ name: "ci", sha256: digest, scopes: ["images.generate", "media"], expires: "2030-01-01T00:00:00+02:00" }]);
      expect(parseKeysText(yamlOf([{ name: "ci", sha256: digest, scopes: ["admin"] }]), "k.json")).to.have.length(1);
      expect(parseKeysText("keys: []\n", "k.yaml")).to.deep.equal([]);
    });

    it("refuses a key named token while auth.token is set, and a name a certificate rule has", () => {
      const keysOf = (...names: string[]) => parseKeysText(yamlOf(names.map((n, i) => entry(n, `key-${i}-0123456789abcdef`, ["admin"]))), "k.yaml");
      const token = expectThrown<KeysFileError>(() => KeySet.build({ token: "t-0123456789abcdef", keys: keysOf("token", "runner"), certificates: [] }, "k.yaml"), {
        type: KeysFileError,
        code: "conflict",
      });
      expect(token.problems).to.deep.equal(["keys[0].name: token is taken by auth.token"]);
      const certificates = compileCertificateRules(certificateRulesSchema.parse([{ name: "runner", subject: "CN=runner", scopes: ["mutating"] }]));
      const rule = expectThrown<KeysFileError>(() => KeySet.build({ token: "", keys: keysOf("ci", "Runner"), certificates }, "k.yaml"), { type: KeysFileError, code: "conflict" });
      expect(rule.problems).to.deep.equal(["keys[1].name: Runner is taken by auth.certificates"]);
      // Without auth.token, token is a name like any other.
      expect(KeySet.build({ token: "", keys: keysOf("token"), certificates: [] }, "k.yaml").names).to.deep.equal(new Set(["token"]));
    });

    it("stops the start with a config error naming auth.keysFile when the file is missing or invalid", async () => {
      const registry = new Registry();
      const logger = pino({ level: "silent" });
      const missing = expectThrown(() => new AccessControl({ auth: { token: "", keysFile: join(dir, "nope.yaml"), certificates: [] }, logger, registry }), { type: ConfigError });
      expect(missing.message).to.match(/auth\.keysFile: .*nope\.yaml: cannot read it \(ENOENT\)/);
      const file = join(dir, "invalid.yaml");
      await writeFile(file, "keys:\n  - { name: a, sha256: x, scopes: [admin] }\n");
      const invalid = expectThrown(() => new AccessControl({ auth: { token: "", keysFile: file, certificates: [] }, logger, registry: new Registry() }), { type: ConfigError });
      expect(invalid.message).to.match(/auth\.keysFile: .*invalid\.yaml: keys\[0\]\.sha256: expected/);
    });
  });

  describe("reloads", () => {
    const A = "key-a-0123456789abcdef";
    const B = "key-b-0123456789abcdef";

    it("a good file replaces the keys at once; a bad one keeps them, says why, and counts an error", async () => {
      const lines: Record<string, unknown>[] = [];
      const { control, file, registry } = await controlOf([entry("a", A, ["mutating"])], {}, { lines });
      control.start();
      try {
        expect(await metricValue(registry, "mmgate_auth_keys")).to.equal(1);
        const verdictOf = (key: string): Verdict => control.authorize(images.generate, `Bearer ${key}`, undefined);
        expect(verdictOf(A).caller?.name).to.equal("a");

        await writeFile(file, yamlOf([entry("b", B, ["images.generate"]), entry("c", "key-c-0123456789abcdef", ["admin"])]));
        // The watch (or the poll) sees it: no call to reload here.
        await eventually(() => expect(verdictOf(B).caller?.name).to.equal("b"));
        expect(verdictOf(A).refusal?.rawMessage).to.equal("invalid bearer token");
        expect(await metricValue(registry, "mmgate_auth_keys_reload_total", { result: "ok" })).to.equal(1);
        expect(await metricValue(registry, "mmgate_auth_keys")).to.equal(2);
        expect(lines.find((l) => l.msg === "auth keys reloaded")).to.deep.include({ keys: 2 });

        await writeFile(file, yamlOf([{ name: "b", sha256: "not-a-digest", scopes: ["admin"] }]));
        await eventually(async () => expect(await metricValue(registry, "mmgate_auth_keys_reload_total", { result: "error" })).to.equal(1));
        expect(verdictOf(B).caller?.name, "the keys before stay in force").to.equal("b");
        const warning = lines.find((l) => typeof l.msg === "string" && l.msg.startsWith("auth keys file not reloaded"));
        expect(warning?.msg).to.equal(
          "auth keys file not reloaded: keys[0].sha256: expected the key's SHA-256 as 64 hex digits (mmgate keys hash prints it); the 2 keys loaded before stay in force",
        );
        expect(warning).to.deep.include({ level: 40, code: "invalid" });

        // Truncated while being written: the keys stay too.
        await writeFile(file, "");
        await eventually(async () => expect(await metricValue(registry, "mmgate_auth_keys_reload_total", { result: "error" })).to.equal(2));
        expect(verdictOf(B).caller?.name).to.equal("b");
        expect(await metricValue(registry, "mmgate_auth_keys")).to.equal(2);
      } finally {
        control.close();
      }
    });

    it("reads an unchanged file as unchanged, and serializes reloads", async () => {
      const { control, file } = await controlOf([entry("a", A, ["mutating"])]);
      expect(await control.reload()).to.equal("unchanged");
      await writeFile(file, yamlOf([entry("b", B, ["mutating"])]));
      const [first, second] = await Promise.all([control.reload(), control.reload()]);
      expect([first, second]).to.deep.equal(["ok", "unchanged"]);
      control.close();
    });

    it("warns of a scope that names nothing known, with the nearest one, once the catalog is read", async () => {
      const lines: Record<string, unknown>[] = [];
      const { control } = await controlOf([entry("a", A, ["images.genrate", "mutating"])], {}, { lines });
      control.start();
      try {
        await eventually(() => expect(lines.map((l) => l.msg)).to.include("auth: caller a: scope images.genrate names no access level, service or method; did you mean images.generate?; it grants nothing"));
      } finally {
        control.close();
      }
    });
  });

  describe("certificates", () => {
    /** A PeerCertificate as Node hands one out, with only what the rules read. */
    function cert(subject: Record<string, string | string[]>, subjectaltname?: string): PeerCertificate {
      return { subject, issuer: { CN: "test CA" }, ...(subjectaltname !== undefined ? { subjectaltname } : {}) } as unknown as PeerCertificate;
    }
    const rules = [
      { name: "runner", subject: "CN=ci-runner,O=Acme", scopes: ["mutating"] },
      { name: "workload", san: "spiffe://acme.example/ns/prod/sa/hop", scopes: ["encode-hop", "images.generate"] },
      { name: "web", san: "DNS:Web.Acme.Example", scopes: ["images"] },
      { name: "pinned", subject: "CN=pinned", san: "IP:::1", scopes: ["admin"], limits: { imagesPerMinute: 10 } },
    ];
    let control: AccessControl;
    const TOKEN = "token-0123456789abcdef-cert";
    before(() => {
      const config = resolveConfig({ auth: { token: TOKEN, certificates: rules } }, []);
      control = new AccessControl({ auth: config.auth, logger: pino({ level: "silent" }), registry: new Registry() });
    });

    // [certificate, the caller (or undefined), the verdict on images Generate]
    const cases: [string, PeerCertificate, string | undefined, "ok" | "unauthenticated"][] = [
      ["subject with both attributes", cert({ CN: "ci-runner", O: "Acme", OU: "build" }), "runner", "ok"],
      ["subject attributes, one of a list", cert({ CN: "ci-runner", O: ["Other", "Acme"] }), "runner", "ok"],
      ["subject missing an attribute", cert({ CN: "ci-runner" }), undefined, "unauthenticated"],
      ["a SPIFFE ID among other SANs", cert({ CN: "x" }, "DNS:hop.internal, URI:spiffe://acme.example/ns/prod/sa/hop"), "workload", "ok"],
      ["a SPIFFE ID of another workload", cert({ CN: "x" }, "URI:spiffe://acme.example/ns/prod/sa/other"), undefined, "unauthenticated"],
      ["a DNS SAN, case aside", cert({}, "DNS:web.acme.example"), "web", "ok"],
      ["a JSON-quoted SAN", cert({}, 'DNS:"web.acme.example", URI:"spiffe://x/a,b"'), "web", "ok"],
      ["subject and an IPv6 SAN in another spelling", cert({ CN: "pinned" }, "IP Address:0:0:0:0:0:0:0:1"), "pinned", "ok"],
      ["the subject without the SAN", cert({ CN: "pinned" }), undefined, "unauthenticated"],
    ];
    for (const [what, certificate, name, outcome] of cases) {
      it(`${what}: ${name ?? "no caller"}, ${outcome}`, () => {
        const verdict = control.authorize(images.generate, null, certificate);
        expect(verdict.caller?.name).to.equal(name);
        if (name !== undefined) expect(verdict.caller?.via).to.equal("certificate");
        if (outcome === "ok") expect(verdict.refusal).to.equal(undefined);
        else expect(verdict.refusal?.code).to.equal(Code.Unauthenticated);
      });
    }

    it("names the scope a certificate's caller lacks, and the certificate one matching no rule", () => {
      const denied = control.authorize(admin.setServingStatus, null, cert({}, "URI:spiffe://acme.example/ns/prod/sa/hop"));
      expect(denied.refusal?.code).to.equal(Code.PermissionDenied);
      expect(denied.refusal?.rawMessage).to.match(/^certificate workload lacks scope mutating for mmgate.admin.v1.AdminService\/SetServingStatus/);
      const unknown = control.authorize(admin.setServingStatus, null, cert({ CN: "stranger" }));
      expect(unknown.refusal?.rawMessage).to.equal(
        "mmgate.admin.v1.AdminService/SetServingStatus requires a bearer token or a client certificate auth.certificates names; this one (CN=stranger) matches none",
      );
      expect(control.authorize(admin.setServingStatus, null, undefined).refusal?.rawMessage).to.equal(
        "mmgate.admin.v1.AdminService/SetServingStatus requires a bearer token or a client certificate",
      );
    });

    it("lets a bearer header win over the certificate, even a bad one", () => {
      const runner = cert({ CN: "ci-runner", O: "Acme" });
      expect(control.authorize(admin.drain, `Bearer ${TOKEN}`, runner).caller?.name).to.equal("token");
      expect(control.authorize(images.generate, "Bearer wrong-0123456789abcdef", runner).refusal?.rawMessage).to.equal("invalid bearer token");
      // A public method names the certificate's caller, and lets an unknown certificate through anonymous.
      expect(control.authorize(admin.getStatus, null, runner).caller?.name).to.equal("runner");
      expect(control.authorize(admin.getStatus, null, cert({ CN: "stranger" }))).to.deep.equal({});
    });

    it("carries a rule's limits to its caller", () => {
      const { caller } = control.authorize(admin.drain, null, cert({ CN: "pinned" }, "IP Address:::1"));
      expect(caller).to.deep.include({ name: "pinned", limits: { imagesPerMinute: 10 } });
    });

    it("reads Node's subjectaltname text, quoted values included", () => {
      expect(parseAltNames('DNS:a.example, URI:"spiffe://td/a,b", IP Address:10.0.0.1, email:ops@acme.example')).to.deep.equal([
        { type: "DNS", value: "a.example" },
        { type: "URI", value: "spiffe://td/a,b" },
        { type: "IP", value: "10.0.0.1" },
        { type: "email", value: "ops@acme.example" },
      ]);
    });

    const badRules: [string, unknown, RegExp][] = [
      ["neither subject nor san", [{ name: "x", scopes: ["admin"] }], /give subject, san or both/],
      ["a subject without an attribute", [{ name: "x", subject: "ci-runner", scopes: ["admin"] }], /expected attributes such as "CN=client-a"/],
      ["a SAN of no known form", [{ name: "x", san: "ci-runner", scopes: ["admin"] }], /expected "spiffe:\/\/…"/],
      ["two rules of one name", [{ name: "x", subject: "CN=a", scopes: ["admin"] }, { name: "x", subject: "CN=b", scopes: ["admin"] }], /1\.name: duplicate name/],
      ["an unknown field", [{ name: "x", subject: "CN=a", scopes: ["admin"], issuer: "CN=ca" }], /auth\.certificates\.0\.issuer: unknown key/],
    ];
    for (const [what, certificates, message] of badRules) {
      it(`auth.certificates refuses ${what}`, () => {
        const err = expectThrown(() => resolveConfig({ auth: { certificates } }, []), { type: ConfigError });
        expect(err.message).to.match(/auth\.certificates/).and.match(message);
      });
    }
  });
});
