/**
 * CORS in a real browser: a page served from another origin calls
 * ImageService/ListProviders over the Connect protocol with fetch, as a
 * browser client would. Chromium sends the preflight and enforces the
 * answer: the call fails unless `cors.allowedOrigins` lists the page's
 * origin, while the console, same-origin, needs no CORS at all. The same
 * servers run only the images module: the console's other views say so.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { expect } from "chai";
import type { Browser, Page } from "puppeteer-core";
import { consoleModule } from "../../src/console/index.js";
import { imagesModule } from "../../src/images/index.js";
import { startServer, type InProcessServer } from "../support/index.js";
import { launchChromium, requireChromium, screenshot, watchPage } from "./support.js";

/** Runs in the page: one Connect unary call; its JSON answer, or the error fetch threw. */
const CALL = `async (url) => {
  try {
    const res = await fetch(url + "/mmgate.images.v1.ImageService/ListProviders", {
      method: "POST",
      headers: { "content-type": "application/json", "connect-protocol-version": "1" },
      body: "{}",
    });
    return { status: res.status, body: await res.json() };
  } catch (err) {
    return { error: String(err) };
  }
}`;

interface CallResult {
  status?: number;
  body?: { providers?: { name: string }[] };
  error?: string;
}

describe("console: CORS from another origin, and a process without every module (Chromium)", function () {
  this.timeout(60_000);
  let browser: Browser;
  let page: Page;
  let other: Server;
  let otherOrigin: string;
  let closed: InProcessServer;
  let open: InProcessServer;

  before(async function () {
    requireChromium(this);
    // The other origin: a page of its own on another port (another origin by RFC 6454).
    other = createServer((_req, res) => res.writeHead(200, { "content-type": "text/html" }).end("<!doctype html><title>another origin</title><p>another origin</p>"));
    await new Promise<void>((resolve) => other.listen(0, "127.0.0.1", resolve));
    otherOrigin = `http://127.0.0.1:${(other.address() as AddressInfo).port}`;
    [closed, open, browser] = await Promise.all([
      startServer({ modules: [imagesModule, consoleModule] }),
      startServer({ modules: [imagesModule, consoleModule], config: { cors: { allowedOrigins: [otherOrigin] } } }),
      launchChromium(),
    ]);
    page = await browser.newPage();
  });

  after(async () => {
    await browser?.close();
    await Promise.all([closed?.close(), open?.close()]);
    if (other) await new Promise((resolve) => other.close(resolve));
  });

  const callFrom = async (origin: string, server: InProcessServer): Promise<CallResult> => {
    await page.goto(`${origin}/`, { waitUntil: "load" });
    return (await page.evaluate(`(${CALL})(${JSON.stringify(`http://${server.addr}`)})`)) as CallResult;
  };

  it("refuses a page on another origin when cors.allowedOrigins does not list it", async () => {
    const result = await callFrom(otherOrigin, closed);
    expect(result.error).to.match(/Failed to fetch/);
    expect(result.body).to.equal(undefined);
  });

  it("lets it call once cors.allowedOrigins lists its origin", async () => {
    const result = await callFrom(otherOrigin, open);
    expect(result.error).to.equal(undefined);
    expect(result.status).to.equal(200);
    expect(result.body?.providers?.map((p) => p.name)).to.deep.equal(["reference"]);
  });

  it("needs no CORS for the console itself: same origin, the same call works with cors.allowedOrigins empty", async () => {
    const result = await callFrom(`http://${closed.addr}/console`, closed);
    expect(result.error).to.equal(undefined);
    expect(result.status).to.equal(200);
  });

  it("says so in a view whose service this process does not run", async () => {
    const fresh = await browser.newPage();
    const problems = watchPage(fresh);
    try {
      for (const [view, service] of [
        ["relay", "dynamo.kvrelay.v1.KvEventRelay"],
        ["media", "mmgate.media.v1.MediaService"],
        ["hop", "mmgate.encode.v1.EncodeHopService"],
      ] as const) {
        await fresh.goto(`http://${closed.addr}/console/#/${view}`, { waitUntil: "load" });
        await fresh.waitForSelector(`section[data-view="${view}"][data-state="not-served"]`, { timeout: 15_000 });
        const text = (await fresh.$eval(`section[data-view="${view}"] .notice`, (el) => el.textContent)) as string;
        expect(text).to.include(`${service} is not running in this process`);
      }
      await screenshot(fresh, "hop-not-served-1280");
      expect(problems).to.deep.equal([]);
    } finally {
      await fresh.close();
    }
  });
});
