import { expect } from "chai";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { MediaError, type MediaErrorCode } from "../../src/media/errors.js";
import { decodeDataUrl, fetchMedia, type FetchPolicy, type Resolver } from "../../src/media/fetcher.js";
import { expectRejection } from "../support/index.js";
import {
  BLOCKED_HOSTS,
  BLOCKED_IP_NETWORKS,
  blockedNetworkOf,
  checkUrlAllowed,
  DEFAULT_URL_POLICY,
  isBlockedIp,
  type UrlPolicy,
} from "../../src/media/url-policy.js";

function codeOf(fn: () => unknown): MediaErrorCode | "OK" {
  try {
    fn();
    return "OK";
  } catch (error) {
    expect(error).to.be.instanceOf(MediaError);
    return (error as MediaError).code;
  }
}

async function fetchCode(p: Promise<unknown>): Promise<MediaErrorCode | "OK"> {
  try {
    await p;
    return "OK";
  } catch (error) {
    if (!(error instanceof MediaError)) throw error;
    return error.code;
  }
}

describe("URL policy rules", () => {
  const table: [string, UrlPolicy, MediaErrorCode | "OK"][] = [
    ["https://images.example.com/cat.png", DEFAULT_URL_POLICY, "OK"],
    ["http://images.example.com/cat.png", DEFAULT_URL_POLICY, "OK"],
    ["data:image/png;base64,AAAA", DEFAULT_URL_POLICY, "OK"],
    ["DATA:,AAAA", DEFAULT_URL_POLICY, "OK"],
    ["ftp://images.example.com/cat.png", DEFAULT_URL_POLICY, "URL_SCHEME_NOT_ALLOWED"],
    ["file:///etc/passwd", DEFAULT_URL_POLICY, "URL_SCHEME_NOT_ALLOWED"],
    ["not a url", DEFAULT_URL_POLICY, "URL_INVALID"],
    ["http://93.184.216.34/x.png", DEFAULT_URL_POLICY, "URL_DIRECT_IP_NOT_ALLOWED"],
    ["http://[2606:2800:220:1::1]/x.png", DEFAULT_URL_POLICY, "URL_DIRECT_IP_NOT_ALLOWED"],
    ["http://0x7f.1/x.png", DEFAULT_URL_POLICY, "URL_DIRECT_IP_NOT_ALLOWED"],
    ["http://images.example.com:8080/x.png", DEFAULT_URL_POLICY, "URL_DIRECT_PORT_NOT_ALLOWED"],
    ["http://images.example.com:80/x.png", DEFAULT_URL_POLICY, "OK"], // the default port is no explicit port
    ["http://localhost/x.png", DEFAULT_URL_POLICY, "URL_BLOCKED_HOST"],
    ["http://LOCALHOST./x.png", DEFAULT_URL_POLICY, "URL_BLOCKED_HOST"],
    ["http://metadata.google.internal/computeMetadata/v1/", DEFAULT_URL_POLICY, "URL_BLOCKED_HOST"],
    ["http://kubernetes.default.svc/", DEFAULT_URL_POLICY, "URL_BLOCKED_HOST"],
    ["http://localhost/x.png", { ...DEFAULT_URL_POLICY, allowPrivateIps: true }, "OK"],
    ["http://169.254.169.254/latest", { ...DEFAULT_URL_POLICY, allowDirectIp: true }, "URL_BLOCKED_IP"],
    ["http://[::1]/", { ...DEFAULT_URL_POLICY, allowDirectIp: true }, "URL_BLOCKED_IP"],
    ["http://[::ffff:8.8.8.8]/", { ...DEFAULT_URL_POLICY, allowDirectIp: true }, "URL_BLOCKED_IP"],
    ["http://8.8.8.8/", { ...DEFAULT_URL_POLICY, allowDirectIp: true }, "OK"],
    ["http://127.0.0.1/", { ...DEFAULT_URL_POLICY, allowDirectIp: true, allowedIpNetworks: ["127.0.0.1/32"] }, "OK"],
    ["http://127.0.0.2/", { ...DEFAULT_URL_POLICY, allowDirectIp: true, allowedIpNetworks: ["127.0.0.1/32"] }, "URL_BLOCKED_IP"],
    ["http://localhost/", { ...DEFAULT_URL_POLICY, allowedIpNetworks: ["127.0.0.0/8"] }, "URL_BLOCKED_HOST"],
    ["https://cdn.example.com/a.png", { ...DEFAULT_URL_POLICY, allowedMediaDomains: ["cdn.example.com"] }, "OK"],
    ["https://evil.example.com/a.png", { ...DEFAULT_URL_POLICY, allowedMediaDomains: ["cdn.example.com"] }, "URL_DOMAIN_NOT_ALLOWED"],
    ["https://CDN.example.com/a.png", { ...DEFAULT_URL_POLICY, allowedMediaDomains: ["cdn.EXAMPLE.com"] }, "OK"],
    ["https://sub.cdn.example.com/a.png", { ...DEFAULT_URL_POLICY, allowedMediaDomains: ["cdn.example.com"] }, "URL_DOMAIN_NOT_ALLOWED"],
  ];
  for (const [url, policy, expected] of table) {
    it(`${url} → ${expected}`, () => expect(codeOf(() => checkUrlAllowed(url, policy))).to.equal(expected));
  }

  it("names the rule in its message", () => {
    const message = (url: string, policy: UrlPolicy) => {
      try {
        checkUrlAllowed(url, policy);
      } catch (error) {
        return (error as Error).message;
      }
      return "";
    };
    expect(message("ftp://x.example/", DEFAULT_URL_POLICY)).to.equal("Only HTTP(S) and data URLs are allowed");
    expect(message("http://1.2.3.4/", DEFAULT_URL_POLICY)).to.equal("Direct IP access is not allowed: 1.2.3.4");
    expect(message("http://a.example:81/", DEFAULT_URL_POLICY)).to.equal("Explicit ports are not allowed: 81");
    expect(message("http://localhost/", DEFAULT_URL_POLICY)).to.equal("Access to blocked host is not allowed: localhost");
    expect(message("http://10.1.2.3/", { ...DEFAULT_URL_POLICY, allowDirectIp: true })).to.equal(
      "Access to blocked IP address is not allowed: 10.1.2.3 (in 10.0.0.0/8)",
    );
  });

  it("blocks every listed host name", () => {
    for (const host of BLOCKED_HOSTS) {
      expect(codeOf(() => checkUrlAllowed(`http://${host}/`, DEFAULT_URL_POLICY)), host).to.equal("URL_BLOCKED_HOST");
    }
  });

  it("blocks an address at each edge of every listed network", () => {
    const table: [string, string | null][] = [
      ["0.0.0.0", "0.0.0.0/8"], ["0.255.255.255", "0.0.0.0/8"], ["1.0.0.0", null],
      ["10.0.0.0", "10.0.0.0/8"], ["10.255.255.255", "10.0.0.0/8"], ["11.0.0.0", null],
      ["100.63.255.255", null], ["100.64.0.0", "100.64.0.0/10"], ["100.127.255.255", "100.64.0.0/10"], ["100.128.0.0", null],
      ["127.0.0.1", "127.0.0.0/8"], ["127.255.255.255", "127.0.0.0/8"],
      ["169.254.169.254", "169.254.0.0/16"], ["169.255.0.0", null],
      ["172.15.255.255", null], ["172.16.0.0", "172.16.0.0/12"], ["172.31.255.255", "172.16.0.0/12"], ["172.32.0.0", null],
      ["192.0.0.1", "192.0.0.0/24"], ["192.0.1.1", null], ["192.0.2.1", "192.0.2.0/24"],
      ["192.168.1.1", "192.168.0.0/16"], ["192.169.0.0", null],
      ["198.17.255.255", null], ["198.18.0.0", "198.18.0.0/15"], ["198.19.255.255", "198.18.0.0/15"], ["198.20.0.0", null],
      ["198.51.100.7", "198.51.100.0/24"], ["203.0.113.9", "203.0.113.0/24"],
      ["224.0.0.1", "224.0.0.0/4"], ["239.255.255.255", "224.0.0.0/4"], ["240.0.0.1", "240.0.0.0/4"],
      ["255.255.255.255", "240.0.0.0/4"], ["8.8.8.8", null], ["93.184.216.34", null],
      ["::", "::/128"], ["::1", "::1/128"], ["::2", null], ["::ffff:1.2.3.4", "::ffff:0:0/96"],
      ["fc00::1", "fc00::/7"], ["fdff:ffff::1", "fc00::/7"], ["fe80::1", "fe80::/10"], ["febf::1", "fe80::/10"], ["fec0::1", null],
      ["ff02::1", "ff00::/8"], ["2001:4860:4860::8888", null], ["[::1]", "::1/128"],
    ];
    for (const [addr, network] of table) expect(blockedNetworkOf(addr), addr).to.equal(network);
    expect(BLOCKED_IP_NETWORKS).to.have.length(21);
    expect(isBlockedIp("not-an-ip")).to.equal(true);
    expect(isBlockedIp("127.0.0.1", ["127.0.0.1/32"])).to.equal(false);
  });
});

describe("data URLs", () => {
  it("decodes the standard base64 after the first comma, media type ignored", () => {
    expect(Buffer.from(decodeDataUrl("data:image/png;base64,AAEC", 10)).toString("hex")).to.equal("000102");
    expect(Buffer.from(decodeDataUrl("data:,AAE=", 10)).toString("hex")).to.equal("0001");
  });

  it("rejects empty, unpadded, non-base64 and oversized payloads", () => {
    expect(codeOf(() => decodeDataUrl("data:image/png;base64,", 10))).to.equal("DATA_URL_INVALID");
    expect(codeOf(() => decodeDataUrl("data:image/png", 10))).to.equal("DATA_URL_INVALID");
    expect(codeOf(() => decodeDataUrl("data:,AAE", 10))).to.equal("DATA_URL_INVALID");
    expect(codeOf(() => decodeDataUrl("data:,AA%3D", 10))).to.equal("DATA_URL_INVALID");
    expect(codeOf(() => decodeDataUrl(`data:,${"A".repeat(16)}`, 11))).to.equal("FETCH_BODY_TOO_LARGE");
    expect(decodeDataUrl(`data:,${"A".repeat(16)}`, 12)).to.have.length(12);
  });
});

describe("media fetcher against a local HTTP server", function () {
  this.timeout(30_000);
  let server: http.Server;
  let port = 0;
  const BODY = Buffer.from("encoded media bytes");
  const requests: string[] = [];

  before(async () => {
    server = http.createServer((req, res) => {
      const url = new URL(req.url ?? "/", "http://x");
      requests.push(`${req.headers.host} ${url.pathname}`);
      const path = url.pathname;
      const hop = /^\/hop\/(\d+)$/.exec(path);
      if (path === "/ok") return void res.end(BODY);
      if (path === "/trickle") {
        // One byte per write: the body arrives split at every boundary.
        res.writeHead(200);
        let at = 0;
        const next = () => (at < BODY.length ? res.write(BODY.subarray(at, ++at), () => setImmediate(next)) : res.end());
        return void next();
      }
      if (hop) {
        const n = Number(hop[1]);
        res.writeHead(302, { location: n === 0 ? "/ok" : `/hop/${n - 1}` });
        return void res.end();
      }
      if (path === "/to-localhost") return void res.writeHead(302, { location: `http://localhost:${port}/ok` }).end();
      if (path === "/to-private") return void res.writeHead(302, { location: "http://10.0.0.1/ok" }).end();
      if (path === "/to-ftp") return void res.writeHead(301, { location: "ftp://files.example/x" }).end();
      if (path === "/to-data") return void res.writeHead(302, { location: "data:,AAAA" }).end();
      if (path === "/to-other") return void res.writeHead(302, { location: `http://other.test:${port}/ok` }).end();
      if (path === "/missing") return void res.writeHead(404).end("no");
      if (path === "/broken") return void res.writeHead(503).end("down");
      if (path === "/empty") return void res.end();
      if (path === "/big-declared") return void res.writeHead(200, { "content-length": "2048" }).end(Buffer.alloc(2048));
      if (path === "/big-streamed") {
        res.writeHead(200); // chunked, no length
        let sent = 0;
        const push = () => {
          if (sent >= 4096 || res.destroyed) return void res.end();
          sent += 256;
          res.write(Buffer.alloc(256), () => setImmediate(push));
        };
        return void push();
      }
      if (path === "/slow") {
        res.writeHead(200, { "content-length": "100" });
        res.write(Buffer.alloc(10)); // then stall
        return;
      }
      res.writeHead(500).end();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    port = (server.address() as AddressInfo).port;
  });

  after(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const base: FetchPolicy = {
    ...DEFAULT_URL_POLICY,
    timeoutMs: 10_000,
    maxBodyBytes: 1024,
    maxRedirects: 3,
    userAgent: "mmgate-test",
  };
  /** Loopback opened for this test only: IP literal, port, 127.0.0.1/32. */
  const loopback: FetchPolicy = { ...base, allowDirectIp: true, allowDirectPort: true, allowedIpNetworks: ["127.0.0.1/32"] };
  const resolver: Resolver = async (host) => {
    if (host === "media.test" || host === "other.test") return [{ address: "127.0.0.1", family: 4 }];
    if (host === "mixed.test") return [{ address: "93.184.216.34", family: 4 }, { address: "10.1.2.3", family: 4 }];
    if (host === "inner.test") return [{ address: "192.168.0.10", family: 4 }];
    throw new Error(`unknown host ${host}`);
  };

  const table: [string, string, FetchPolicy, MediaErrorCode | "OK"][] = [
    ["default policy refuses the loopback literal", "http://127.0.0.1:{port}/ok", base, "URL_DIRECT_IP_NOT_ALLOWED"],
    ["direct IP allowed but port refused", "http://127.0.0.1:{port}/ok", { ...base, allowDirectIp: true }, "URL_DIRECT_PORT_NOT_ALLOWED"],
    ["IP and port allowed, loopback network still blocked", "http://127.0.0.1:{port}/ok", { ...base, allowDirectIp: true, allowDirectPort: true }, "URL_BLOCKED_IP"],
    ["loopback policy fetches", "http://127.0.0.1:{port}/ok", loopback, "OK"],
    ["blocked host name", "http://localhost:{port}/ok", loopback, "URL_BLOCKED_HOST"],
    ["name resolving to an allowed address", "http://media.test:{port}/ok", loopback, "OK"],
    ["name resolving to a blocked address", "http://inner.test:{port}/ok", loopback, "URL_BLOCKED_IP"],
    ["name with any blocked address", "http://mixed.test:{port}/ok", loopback, "URL_BLOCKED_IP"],
    ["unresolvable name", "http://nowhere.test:{port}/ok", loopback, "URL_RESOLVE_FAILED"],
    ["three redirects are followed", "http://127.0.0.1:{port}/hop/2", loopback, "OK"],
    ["a fourth redirect is refused", "http://127.0.0.1:{port}/hop/3", loopback, "FETCH_TOO_MANY_REDIRECTS"],
    ["redirect limit is configurable", "http://127.0.0.1:{port}/hop/0", { ...loopback, maxRedirects: 0 }, "FETCH_TOO_MANY_REDIRECTS"],
    ["redirect to a blocked host", "http://127.0.0.1:{port}/to-localhost", loopback, "URL_BLOCKED_HOST"],
    ["redirect to a blocked network", "http://127.0.0.1:{port}/to-private", loopback, "URL_BLOCKED_IP"],
    ["redirect to another scheme", "http://127.0.0.1:{port}/to-ftp", loopback, "URL_SCHEME_NOT_ALLOWED"],
    ["redirect to a data URL", "http://127.0.0.1:{port}/to-data", loopback, "FETCH_REDIRECT_INVALID"],
    ["redirect off the allowlist", "http://media.test:{port}/to-other", { ...loopback, allowedMediaDomains: ["media.test"] }, "URL_DOMAIN_NOT_ALLOWED"],
    ["redirect within the allowlist", "http://media.test:{port}/to-other", { ...loopback, allowedMediaDomains: ["media.test", "other.test"] }, "OK"],
    ["HTTP 404", "http://127.0.0.1:{port}/missing", loopback, "FETCH_HTTP_STATUS"],
    ["HTTP 503", "http://127.0.0.1:{port}/broken", loopback, "FETCH_HTTP_STATUS"],
    ["empty body", "http://127.0.0.1:{port}/empty", loopback, "FETCH_EMPTY_BODY"],
    ["declared oversized body", "http://127.0.0.1:{port}/big-declared", loopback, "FETCH_BODY_TOO_LARGE"],
    ["streamed oversized body", "http://127.0.0.1:{port}/big-streamed", loopback, "FETCH_BODY_TOO_LARGE"],
    ["streamed body under a larger cap", "http://127.0.0.1:{port}/big-streamed", { ...loopback, maxBodyBytes: 8192 }, "OK"],
    ["slow body hits the timeout", "http://127.0.0.1:{port}/slow", { ...loopback, timeoutMs: 300 }, "FETCH_TIMEOUT"],
  ];
  for (const [name, template, policy, expected] of table) {
    it(`${name} → ${expected}`, async () => {
      const url = template.replace("{port}", String(port));
      expect(await fetchCode(fetchMedia(url, policy, { resolver }))).to.equal(expected);
    });
  }

  it("returns the body and sends the configured user agent", async () => {
    const body = await fetchMedia(`http://media.test:${port}/ok`, loopback, { resolver });
    expect(Buffer.from(body).equals(BODY)).to.equal(true);
    expect(requests).to.include(`media.test:${port} /ok`);
  });

  it("reassembles a body delivered one byte at a time", async () => {
    const body = await fetchMedia(`http://127.0.0.1:${port}/trickle`, loopback);
    expect(Buffer.from(body).equals(BODY)).to.equal(true);
    const capped = await fetchCode(fetchMedia(`http://127.0.0.1:${port}/trickle`, { ...loopback, maxBodyBytes: BODY.length - 1 }));
    expect(capped).to.equal("FETCH_BODY_TOO_LARGE");
  });

  it("never connects for a refused redirect target", async () => {
    requests.length = 0;
    await fetchCode(fetchMedia(`http://127.0.0.1:${port}/to-localhost`, loopback, { resolver }));
    expect(requests).to.deep.equal([`127.0.0.1:${port} /to-localhost`]);
  });

  it("maps 4xx to INVALID_ARGUMENT and 5xx to UNAVAILABLE", async () => {
    for (const [path, status] of [["missing", 3], ["broken", 14]] as const) {
      const error = await expectRejection(fetchMedia(`http://127.0.0.1:${port}/${path}`, loopback), { type: MediaError });
      expect(error.status, path).to.equal(status);
    }
  });

  it("stops when the caller cancels", async () => {
    const controller = new AbortController();
    const pending = fetchCode(fetchMedia(`http://127.0.0.1:${port}/slow`, loopback, { signal: controller.signal }));
    setTimeout(() => controller.abort(), 50);
    expect(await pending).to.equal("FETCH_CANCELED");
  });

  describe("a resolver that never answers", () => {
    const silent: Resolver = () => new Promise(() => undefined);

    it("cannot outlive the fetch timeout", async () => {
      expect(await fetchCode(fetchMedia(`http://media.test:${port}/ok`, { ...loopback, timeoutMs: 100 }, { resolver: silent }))).to.equal(
        "FETCH_TIMEOUT",
      );
    });

    it("cannot outlive the caller's cancellation", async () => {
      const controller = new AbortController();
      const pending = fetchCode(fetchMedia(`http://media.test:${port}/ok`, loopback, { resolver: silent, signal: controller.signal }));
      setTimeout(() => controller.abort(), 50);
      expect(await pending).to.equal("FETCH_CANCELED");
    });
  });
});
