/**
 * An outbound channel presenting a client certificate (`certFile`,
 * `keyFile`) to a server that requires one, on the lean client transport
 * and on connect's; the certificate re-read when its files change (new
 * connections present the new one, an open connection goes on), a pair
 * that does not check out left unused; and the settings' validation.
 */
import { copyFileSync, mkdirSync, renameSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Code } from "@connectrpc/connect";
import { expect } from "chai";
import { Registry } from "prom-client";
import { ChannelConfigError, channelConfigSchema, channelDefaults, createChannel, type Channel, type ChannelOptions } from "../../src/rpc/index.js";
import { connectErrorOf, expectThrown, metricValue, startServer, type InProcessServer } from "../support/index.js";
import { TestPki, opensslAvailable, type TestCa, type TestCertificate } from "../support/pki.js";
import { whoAmIModule, whoAmIOver } from "../support/who-am-i.js";

const whoAmI = (channel: Channel) => whoAmIOver(channel);

describe("outbound channels with a client certificate", function () {
  this.timeout(30_000);
  let pki: TestPki;
  let ca: TestCa;
  let server: InProcessServer;
  let client: TestCertificate;
  let nextClient: TestCertificate;
  const channels: Channel[] = [];

  before(async function () {
    if (!opensslAvailable()) this.skip();
    pki = new TestPki();
    ca = pki.ca("channel-test-ca");
    const serverCert = pki.issue(ca, { cn: "localhost", usage: "server" });
    client = pki.issue(ca, { cn: "hop-1", usage: "client" });
    nextClient = pki.issue(ca, { cn: "hop-1", usage: "client" });
    server = await startServer({
      modules: [whoAmIModule],
      config: { tls: { certFile: serverCert.certFile, keyFile: serverCert.keyFile, clientCaFile: ca.certFile, clientAuth: "require" } },
    });
  });
  after(async () => {
    for (const c of channels) c.abort();
    await server?.close();
    pki?.remove();
  });

  const open = (options: Partial<ChannelOptions>, deps: Parameters<typeof createChannel>[2] = {}) => {
    const channel = createChannel(server.addr, { ...channelDefaults, tls: true, caFile: ca.certFile, ...options }, deps);
    channels.push(channel);
    return channel;
  };

  for (const leanPath of [true, false]) {
    it(`presents its certificate to a server that requires one (leanPath ${leanPath})`, async () => {
      const channel = open({ certFile: client.certFile, keyFile: client.keyFile, leanPath });
      expect(await whoAmI(channel)).to.equal(`hop-1/${client.serialNumber}`);
    });
  }

  it("without a certificate, is turned away", async () => {
    const err = await connectErrorOf(whoAmI(open({})));
    expect([Code.Unavailable, Code.Canceled]).to.include(err.code);
  });

  it("presents a replaced certificate on its next connection, while the open one goes on", async () => {
    const dir = join(pki.dir, "channel-rotation");
    mkdirSync(dir);
    copyFileSync(client.certFile, join(dir, "tls.crt"));
    copyFileSync(client.keyFile, join(dir, "tls.key"));
    const registry = new Registry();
    const logs: string[] = [];
    const logger = { info: (o: object, m: string) => void logs.push(`${m} ${JSON.stringify(o)}`), warn: (o: object, m: string) => void logs.push(`${m} ${JSON.stringify(o)}`) };
    // A connection idle for 300 ms is closed, so that the next call opens another.
    const channel = open({ certFile: join(dir, "tls.crt"), keyFile: join(dir, "tls.key"), idleConnectionTimeoutMs: 300 }, { registry, logger: logger as never });
    expect(await whoAmI(channel)).to.equal(`hop-1/${client.serialNumber}`);
    expect(await metricValue(registry, "mmgate_tls_certificate_expiry_timestamp_seconds", { role: "client" })).to.be.greaterThan(Date.now() / 1000);

    // Rotated as a certificate manager does: written aside, renamed over.
    copyFileSync(nextClient.keyFile, join(dir, "tls.key.new"));
    copyFileSync(nextClient.certFile, join(dir, "tls.crt.new"));
    renameSync(join(dir, "tls.key.new"), join(dir, "tls.key"));
    renameSync(join(dir, "tls.crt.new"), join(dir, "tls.crt"));
    // The open connection carries on with the certificate it presented.
    expect(await whoAmI(channel)).to.equal(`hop-1/${client.serialNumber}`);
    // Once it went idle and closed, the next connection presents the new one.
    await sleep(600);
    expect(await whoAmI(channel)).to.equal(`hop-1/${nextClient.serialNumber}`);
    expect(await metricValue(registry, "mmgate_tls_reload_total", { role: "client", result: "success" })).to.equal(1);
    expect(logs.some((l) => l.startsWith("a channel's TLS files changed: its new connections use them"))).to.equal(true);

    // Half a rotation (a key that is not the certificate's) is not used.
    copyFileSync(client.keyFile, join(dir, "tls.key"));
    await sleep(600);
    expect(await whoAmI(channel)).to.equal(`hop-1/${nextClient.serialNumber}`);
    expect(await metricValue(registry, "mmgate_tls_reload_total", { role: "client", result: "error" })).to.equal(1);
    expect(logs.some((l) => l.includes("cannot be used") && l.includes("KEY_MISMATCH"))).to.equal(true);
  });

  it("names an unusable certificate or key in a ChannelConfigError", () => {
    expectThrown(() => open({ certFile: "/no/cert.pem", keyFile: client.keyFile }), { type: ChannelConfigError, message: /^certFile: cannot read \/no\/cert\.pem/ });
    expectThrown(() => open({ certFile: client.certFile, keyFile: nextClient.keyFile }), { type: ChannelConfigError, message: /^keyFile: .* is not the key of the certificate/ });
    expectThrown(() => open({ caFile: "/no/ca.pem" }), { type: ChannelConfigError, message: /^caFile: cannot read \/no\/ca\.pem/ });
  });

  it("validates the settings: certFile and keyFile together, and only with tls", () => {
    const issues = (input: object) => channelConfigSchema.safeParse(input).error?.issues.map((i) => `${i.path.join(".")}: ${i.message}`) ?? [];
    expect(issues({ tls: true, certFile: "c.pem" })).to.deep.equal(["keyFile: certFile and keyFile go together"]);
    expect(issues({ tls: true, keyFile: "k.pem" })).to.deep.equal(["certFile: certFile and keyFile go together"]);
    expect(issues({ certFile: "c.pem", keyFile: "k.pem" })).to.deep.equal(["certFile: certFile needs tls: true"]);
    expect(issues({ tls: true, certFile: "c.pem", keyFile: "k.pem" })).to.deep.equal([]);
  });
});
