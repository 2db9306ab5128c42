/**
 * The console module's routes without a browser: the page and its bundle
 * under /console/ with the Content-Security-Policy, revalidation, the
 * redirect to the trailing slash, and nothing at all with
 * `console.enabled: false`. test/browser/ drives the page itself.
 */
import { expect } from "chai";
import { CONSOLE_CSP, consoleModule } from "../../src/console/index.js";
import { relayModule } from "../../src/relay/index.js";
import { startServer, type InProcessServer } from "../support/index.js";

describe("console module: /console/ on the main port", function () {
  // The first request builds the bundle with esbuild.
  this.timeout(30_000);
  let server: InProcessServer;
  let bare: InProcessServer;
  let off: InProcessServer;
  before(async () => {
    [server, bare, off] = await Promise.all([
      startServer({ modules: [consoleModule, relayModule] }),
      startServer({ modules: [consoleModule] }),
      startServer({ modules: [consoleModule], config: { console: { enabled: false } } }),
    ]);
  });
  after(async () => {
    await Promise.all([server?.close(), bare?.close(), off?.close()]);
  });

  const get = (srv: InProcessServer, path: string, headers: Record<string, string> = {}) => fetch(`${srv.baseUrl}${path}`, { headers, redirect: "manual" });

  it("serves the page with a strict Content-Security-Policy (no inline script, nothing from elsewhere)", async () => {
    const res = await get(server, "/console/");
    expect(res.status).to.equal(200);
    expect(res.headers.get("content-type")).to.equal("text/html; charset=utf-8");
    const csp = res.headers.get("content-security-policy") ?? "";
    expect(csp).to.equal(CONSOLE_CSP);
    expect(csp).to.include("default-src 'self'").and.include("script-src 'self'").and.not.match(/unsafe|\*|https?:/);
    expect(res.headers.get("x-content-type-options")).to.equal("nosniff");
    expect(res.headers.get("x-frame-options")).to.equal("DENY");
    const html = await res.text();
    // Every script is a file of the bundle, none inline; nothing is loaded from another origin.
    expect(html).to.match(/<script type="module" src="app.js"><\/script>/);
    expect(html).to.not.match(/<script(?![^>]*\bsrc=)[^>]*>/);
    expect(html).to.not.match(/(src|href)="(https?:)?\/\//);
  });

  it("serves the bundle and its style sheet, revalidated by ETag", async () => {
    const js = await get(server, "/console/app.js");
    expect(js.status).to.equal(200);
    expect(js.headers.get("content-type")).to.equal("text/javascript; charset=utf-8");
    expect(js.headers.get("cache-control")).to.equal("no-cache");
    const body = await js.text();
    // One self-contained file: no import of a package (or of anything) left for the browser to fetch.
    expect(body.length).to.be.greaterThan(10_000);
    expect(body).to.not.match(/\bimport\s*(\(|["'{*])|\bfrom\s*["']/);
    const etag = js.headers.get("etag")!;
    const again = await get(server, "/console/app.js", { "if-none-match": etag });
    expect(again.status).to.equal(304);
    expect((await get(server, "/console/app.css")).headers.get("content-type")).to.equal("text/css; charset=utf-8");
    expect((await get(server, "/console/no-such-file.js")).status).to.equal(404);
  });

  it("redirects /console to /console/, where the page's relative URLs resolve", async () => {
    const res = await get(server, "/console?x=1");
    expect(res.status).to.equal(308);
    expect(res.headers.get("location")).to.equal("/console/?x=1");
  });

  it("reads the relay's open streams for the relay view, and null without a relay", async () => {
    const res = await get(server, "/console/api/relay-streams");
    expect(await res.json()).to.deep.equal({ streams: { catalog: 0, pool: 0, readiness: 0, load: 0 } });
    expect(await (await get(bare, "/console/api/relay-streams")).json()).to.deep.equal({ streams: null });
  });

  it("serves nothing under /console/ with console.enabled: false", async () => {
    for (const path of ["/console/", "/console", "/console/app.js"]) expect((await get(off, path)).status, path).to.equal(404);
  });
});
