import { expect } from "chai";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { Code } from "@connectrpc/connect";
import { ConfigError, loadConfig, redactedConfig } from "../../src/server/config/index.js";
import { fetchPolicy, mediaConfigSchema, type MediaConfig } from "../../src/media/config.js";
import { MediaError, type MediaErrorCode } from "../../src/media/errors.js";
import { decodeDataUrl, fetchMedia, REDIRECT_STATUSES, type FetchPolicy, type Resolver } from "../../src/media/fetcher.js";
import { mediaModule } from "../../src/media/index.js";
import { DEFAULT_URL_POLICY } from "../../src/media/url-policy.js";
import { expectRejection } from "../support/index.js";

async function fetchCode(p: Promise<unknown>): Promise<MediaErrorCode | "OK"> {
  try {
    await p;
    return "OK";
  } catch (error) {
    if (!(error instanceof MediaError)) throw error;
    return error.code;
  }
}

function dataUrlResult(payload: string): string {
  try {
    return Buffer.from(decodeDataUrl(`data:application/octet-stream;base64,${payload}`, 1024)).toString("hex");
  } catch (error) {
    if (!(error instanceof MediaError)) throw error;
    return error.code;
  }
}

describe("data URL base64 as Rust's STANDARD engine decodes it", () => {
  // Canonical padding required, zero trailing bits, the standard alphabet only.
  const table: [string, string, string][] = [
    ["QQ==", "41", "one byte, canonical"],
    ["QR==", "DATA_URL_INVALID", "one byte, non-zero trailing bits"],
    ["QQ=", "DATA_URL_INVALID", "one byte, short padding"],
    ["QQ", "DATA_URL_INVALID", "one byte, no padding"],
    ["QUI=", "4142", "two bytes, canonical"],
    ["QUJ=", "DATA_URL_INVALID", "two bytes, non-zero trailing bits"],
    ["QUI", "DATA_URL_INVALID", "two bytes, no padding"],
    ["QUJD", "414243", "three bytes, no padding needed"],
    ["Zg==", "66", "'f'"],
    ["Zh==", "DATA_URL_INVALID", "'f' with trailing bits"],
    ["Zm8=", "666f", "'fo'"],
    ["Zm9=", "DATA_URL_INVALID", "'fo' with trailing bits"],
    ["+/8=", "fbff", "'+' and '/' of the standard alphabet"],
    ["-_8=", "DATA_URL_INVALID", "URL-safe '-' and '_'"],
    ["QUJDRA==", "41424344", "four bytes"],
    ["QUJDRB==", "DATA_URL_INVALID", "four bytes, trailing bits"],
    ["Q===", "DATA_URL_INVALID", "three padding characters"],
    ["====", "DATA_URL_INVALID", "padding only"],
    ["QQ==QQ==", "DATA_URL_INVALID", "padding inside"],
    ["=QQ=", "DATA_URL_INVALID", "padding first"],
    ["A", "DATA_URL_INVALID", "a lone symbol"],
    ["QQ ==", "DATA_URL_INVALID", "inner space"],
    [" QUJD", "DATA_URL_INVALID", "leading space"],
    ["QUJD\n", "DATA_URL_INVALID", "trailing newline"],
    ["QU\nJD", "DATA_URL_INVALID", "inner newline"],
    ["QQ%3D%3D", "DATA_URL_INVALID", "percent-escaped padding"],
    ["", "DATA_URL_INVALID", "empty payload"],
  ];
  for (const [payload, expected, why] of table) {
    it(`${JSON.stringify(payload)} (${why}) → ${expected}`, () => expect(dataUrlResult(payload)).to.equal(expected));
  }

  it("agrees with a canonical re-encoding for every accepted one- and two-byte payload", () => {
    const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (const a of alphabet) {
      for (const b of alphabet) {
        const one = `${a}${b}==`;
        const accepted = dataUrlResult(one) !== "DATA_URL_INVALID";
        const canonical = Buffer.from(Buffer.from(one, "base64").toString("base64")).toString() === one;
        expect(accepted, one).to.equal(canonical);
      }
    }
  });
});

describe("media fetcher conformance against a local HTTP server", function () {
  this.timeout(30_000);
  let server: http.Server;
  let port = 0;
  const BODY = Buffer.from("encoded media bytes");
  const seen: string[] = [];

  before(async () => {
    server = http.createServer((req, res) => {
      const url = new URL(req.url ?? "/", "http://x");
      seen.push(`${req.headers.host} ${url.pathname}`);
      const status = /^\/status\/(\d+)$/.exec(url.pathname);
      if (url.pathname === "/ok") return void res.end(BODY);
      if (status) return void res.writeHead(Number(status[1]), { location: "/ok" }).end();
      if (url.pathname === "/moved-nowhere") return void res.writeHead(301).end();
      if (url.pathname === "/to-mixed") return void res.writeHead(302, { location: `http://mixed.test:${port}/ok` }).end();
      res.writeHead(404).end();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    port = (server.address() as AddressInfo).port;
  });

  after(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const loopback: FetchPolicy = {
    ...DEFAULT_URL_POLICY,
    allowDirectIp: true,
    allowDirectPort: true,
    allowedIpNetworks: ["127.0.0.1/32"],
    timeoutMs: 10_000,
    maxBodyBytes: 1024,
    maxRedirects: 3,
    userAgent: "mmgate-test",
  };

  describe("redirect statuses", () => {
    it("follows exactly 301, 302, 303, 307 and 308", () => {
      expect([...REDIRECT_STATUSES].sort()).to.deep.equal([301, 302, 303, 307, 308]);
    });

    for (const status of [301, 302, 303, 307, 308]) {
      it(`${status} with a Location is followed`, async () => {
        const body = await fetchMedia(`http://127.0.0.1:${port}/status/${status}`, loopback);
        expect(Buffer.from(body).equals(BODY)).to.equal(true);
      });
    }

    for (const status of [300, 304, 305, 306, 399]) {
      it(`${status} with a Location is an HTTP status error, INVALID_ARGUMENT, and is not followed`, async () => {
        seen.length = 0;
        const error = await expectRejection(fetchMedia(`http://127.0.0.1:${port}/status/${status}`, loopback), { type: MediaError });
        expect(error.code).to.equal("FETCH_HTTP_STATUS");
        expect(error.actual).to.equal(BigInt(status));
        expect(error.status).to.equal(Code.InvalidArgument);
        expect(seen).to.deep.equal([`127.0.0.1:${port} /status/${status}`]);
      });
    }

    it("a redirect status without a Location is an HTTP status error", async () => {
      const error = await expectRejection(fetchMedia(`http://127.0.0.1:${port}/moved-nowhere`, loopback), { type: MediaError });
      expect([error.code, error.actual]).to.deep.equal(["FETCH_HTTP_STATUS", 301n]);
    });
  });

  describe("a name resolving to both allowed and blocked addresses", () => {
    // 127.0.0.1 is allowed through allowedIpNetworks; 10.1.2.3 stays blocked.
    // The local server is the only place a connection can succeed.
    const resolver: Resolver = async (host) => {
      if (host === "mixed.test") return [{ address: "10.1.2.3", family: 4 }, { address: "127.0.0.1", family: 4 }];
      if (host === "local-first.test") return [{ address: "127.0.0.1", family: 4 }, { address: "10.1.2.3", family: 4 }];
      if (host === "inner.test") return [{ address: "10.1.2.3", family: 4 }, { address: "192.168.0.10", family: 4 }];
      throw new Error(`unknown host ${host}`);
    };
    const drop: FetchPolicy = { ...loopback, mixedAddresses: "dropBlocked" };

    it("is refused by default, on the first hop and on a redirect hop", async () => {
      for (const url of [`http://mixed.test:${port}/ok`, `http://127.0.0.1:${port}/to-mixed`]) {
        const error = await expectRejection(fetchMedia(url, loopback, { resolver }), { type: MediaError });
        expect(error.code, url).to.equal("URL_BLOCKED_IP");
        expect(error.message).to.equal("Host mixed.test resolves to a blocked IP address: 10.1.2.3 (in 10.0.0.0/8)");
      }
      expect(await fetchCode(fetchMedia(`http://mixed.test:${port}/ok`, { ...loopback, mixedAddresses: "refuse" }, { resolver }))).to.equal(
        "URL_BLOCKED_IP",
      );
    });

    it("with mixedAddresses dropBlocked, connects to an allowed address only, on either hop", async () => {
      seen.length = 0;
      for (const url of [`http://mixed.test:${port}/ok`, `http://127.0.0.1:${port}/to-mixed`]) {
        const body = await fetchMedia(url, drop, { resolver });
        expect(Buffer.from(body).equals(BODY), url).to.equal(true);
      }
      expect(seen).to.deep.equal([`mixed.test:${port} /ok`, `127.0.0.1:${port} /to-mixed`, `mixed.test:${port} /ok`]);
    });

    it("a name with only blocked addresses is refused either way", async () => {
      for (const policy of [loopback, drop]) {
        expect(await fetchCode(fetchMedia(`http://inner.test:${port}/ok`, policy, { resolver }))).to.equal("URL_BLOCKED_IP");
      }
    });

    it("allowPrivateIps checks no address", async () => {
      // Loopback first, so that the connection never tries 10.1.2.3.
      const open: FetchPolicy = { ...loopback, allowPrivateIps: true, allowedIpNetworks: [] };
      expect(await fetchCode(fetchMedia(`http://local-first.test:${port}/ok`, open, { resolver }))).to.equal("OK");
      expect(await fetchCode(fetchMedia(`http://local-first.test:${port}/ok`, loopback, { resolver }))).to.equal("URL_BLOCKED_IP");
    });

    it("the config key defaults to refuse and accepts dropBlocked only besides", () => {
      expect(mediaConfigSchema.parse({}).fetch.mixedAddresses).to.equal("refuse");
      expect(fetchPolicy(mediaConfigSchema.parse({ fetch: { mixedAddresses: "dropBlocked" } })).mixedAddresses).to.equal("dropBlocked");
      expect(mediaConfigSchema.safeParse({ fetch: { mixedAddresses: "filter" } }).success).to.equal(false);
    });
  });

  describe("DYN_MM_ALLOW_INTERNAL", () => {
    const mediaOf = (env: Record<string, string>): MediaConfig => loadConfig({ env }, [mediaModule]).sections.media as MediaConfig;
    const flags = (c: MediaConfig) => [c.fetch.allowDirectIp, c.fetch.allowDirectPort, c.fetch.allowPrivateIps];

    it("1 turns on allowDirectIp, allowDirectPort and allowPrivateIps", () => {
      expect(flags(mediaOf({ DYN_MM_ALLOW_INTERNAL: "1" }))).to.deep.equal([true, true, true]);
    });

    it("any other value has no effect and is no config error", () => {
      for (const value of ["0", "true", "yes", "1.0", "01", "", "2"]) {
        expect(flags(mediaOf({ DYN_MM_ALLOW_INTERNAL: value })), value).to.deep.equal([false, false, false]);
      }
      expect(flags(mediaOf({}))).to.deep.equal([false, false, false]);
    });

    it("wins over the individual flags, and print-config shows the flags, not the switch", () => {
      const config = loadConfig({ env: { DYN_MM_ALLOW_INTERNAL: "1", MMGATE_MEDIA__FETCH__ALLOW_PRIVATE_IPS: "false" } }, [mediaModule]);
      const media = config.sections.media as MediaConfig;
      expect(flags(media)).to.deep.equal([true, true, true]);
      const printed = (redactedConfig(config).media as { fetch: Record<string, unknown> }).fetch;
      expect(printed).to.not.have.property("allowInternal");
      // What print-config shows parses back to the same section.
      expect(mediaConfigSchema.parse(redactedConfig(config).media)).to.deep.equal(media);
    });

    it("lets the fetcher reach a loopback server by IP literal and port", async () => {
      const policy = fetchPolicy(mediaOf({ DYN_MM_ALLOW_INTERNAL: "1" }));
      expect(Buffer.from(await fetchMedia(`http://127.0.0.1:${port}/ok`, policy)).equals(BODY)).to.equal(true);
      const closed = fetchPolicy(mediaOf({ DYN_MM_ALLOW_INTERNAL: "true" }));
      expect(await fetchCode(fetchMedia(`http://127.0.0.1:${port}/ok`, closed))).to.equal("URL_DIRECT_IP_NOT_ALLOWED");
    });

    it("config errors still name their variable", () => {
      expect(() => loadConfig({ env: { MMGATE_MEDIA__FETCH__MIXED_ADDRESSES: "sometimes" } }, [mediaModule])).to.throw(
        ConfigError,
        /MMGATE_MEDIA__FETCH__MIXED_ADDRESSES/,
      );
    });
  });
});
