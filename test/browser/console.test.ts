/**
 * The console (src/console) in a real Chromium against a real server with
 * every `serve` module: each view loads without a console error at 1280 and
 * 390 px wide, an n = 4 stream fills its grid with partial images and then
 * the finals, a dropped file shows the hash the CLI prints, the relay view
 * follows `mmgate kv publish`, and a wrong key shows UNAUTHENTICATED.
 * Screenshots of each view land in test-output/console/ for review.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import type { Browser, Page } from "puppeteer-core";
import sharp from "sharp";
import { CONSOLE_CSP } from "../../src/console/index.js";
import { builtinModules } from "../../src/modules.js";
import { runMmgate, startServer, type InProcessServer } from "../support/index.js";
import { launchChromium, requireChromium, screenshot, watchPage } from "./support.js";

const TOKEN = "console-test-token-0123456789";
const VIEWS = ["images", "media", "relay", "hop", "health"] as const;

/** Drops a file (base64 bytes) on the media view's drop zone, as a drag from the desktop does. */
const DROP_FILE = `(b64, name, type) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const transfer = new DataTransfer();
  transfer.items.add(new File([bytes], name, { type }));
  const zone = document.querySelector(".drop");
  for (const kind of ["dragenter", "dragover", "drop"]) {
    zone.dispatchEvent(new DragEvent(kind, { dataTransfer: transfer, bubbles: true, cancelable: true }));
  }
}`;

/** Router events for the default pool: two workers' chains of stored blocks. */
function routerEvents(worker: number, blocks: number): string {
  const stored = Array.from({ length: blocks }, (_, i) => ({ block_hash: worker * 1000 + i, tokens_hash: worker * 100_000 + i * 7 + 1 }));
  return `${JSON.stringify({ worker_id: worker, event: { event_id: 1, dp_rank: 0, data: { stored: { parent_hash: null, blocks: stored } } } })}\n`;
}

describe("console: the browser page (Chromium)", function () {
  this.timeout(60_000);
  let server: InProcessServer;
  let browser: Browser;
  let page: Page;
  let problems: string[];
  let dir: string;
  let base: string;

  before(async function () {
    requireChromium(this);
    dir = mkdtempSync(join(tmpdir(), "mmgate-console-"));
    [server, browser] = await Promise.all([
      startServer({
        modules: builtinModules,
        config: {
          auth: { token: TOKEN },
          // Slow enough that the partial images are on screen for a while before the finals.
          images: { reference: { latencyMs: 1500 } },
          // A filter small enough that a few events show in the heat map.
          relay: { pools: [{ name: "default", expectedBlocks: 16384 }] },
        },
      }),
      launchChromium(),
    ]);
    base = `http://${server.addr}/console/`;
  });

  after(async () => {
    await browser?.close();
    await server?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  beforeEach(async () => {
    page = await browser.newPage();
    problems = watchPage(page);
    await page.setViewport({ width: 1280, height: 900 });
  });

  afterEach(async () => {
    await page?.close();
  });

  /** Opens a view and waits until it has what it first asks the server for. */
  async function open(view: string): Promise<void> {
    await page.goto(`${base}#/${view}`, { waitUntil: "load" });
    await page.waitForSelector(`section[data-view="${view}"][data-state="ready"]`, { timeout: 15_000 });
  }

  async function useKey(key: string): Promise<void> {
    await page.$eval("#key", (input) => ((input as unknown as { value: string }).value = ""));
    await page.type("#key", key);
    await page.click('#key-form button[type="submit"]');
  }

  it("serves every view with its Content-Security-Policy and no console error, at 1280 and 390 px wide", async () => {
    const response = await page.goto(base, { waitUntil: "load" });
    expect(response?.status()).to.equal(200);
    const csp = response?.headers()["content-security-policy"] ?? "";
    expect(csp).to.equal(CONSOLE_CSP);
    expect(csp).to.include("default-src 'self'").and.not.include("unsafe-inline");
    for (const width of [1280, 390]) {
      await page.setViewport({ width, height: width === 390 ? 844 : 900 });
      for (const view of VIEWS) {
        await open(view);
        if (view === "relay") await page.waitForSelector(".pool[data-sequence]", { timeout: 15_000 });
        // Nothing wider than the window: the layout fits a phone.
        const overflow = (await page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")) as number;
        expect(overflow, `${view} at ${width} px`).to.be.at.most(0);
        await screenshot(page, `${view}-${width}`);
      }
    }
    // Every control is labelled: by a <label for>, aria-label or an enclosing label.
    await open("images");
    const unlabelled = (await page.evaluate(`[...document.querySelectorAll("input, select, textarea")]
      .filter((el) => el.type !== "hidden" && el.labels.length === 0 && !el.getAttribute("aria-label"))
      .map((el) => el.name || el.id)`)) as string[];
    expect(unlabelled).to.deep.equal([]);
    expect(problems).to.deep.equal([]);
  });

  it("is usable from the keyboard: Tab reaches the views' links, Enter opens one, its drop zone takes Enter", async () => {
    await open("images");
    const active = () => page.evaluate("(() => { const el = document.activeElement; return el ? (el.dataset.view || el.id || el.className) : ''; })()") as Promise<string>;
    let reached = false;
    for (let i = 0; i < 20 && !reached; i++) {
      await page.keyboard.press("Tab");
      reached = (await active()) === "media";
    }
    expect(reached, "Tab reaches the Media link").to.equal(true);
    await page.keyboard.press("Enter");
    await page.waitForSelector('section[data-view="media"][data-state="ready"]');
    // Focus moves to the new view's heading, so the next Tab goes into the view.
    expect(await active()).to.equal("media-title");
    await page.keyboard.press("Tab");
    expect(await active()).to.equal("drop");
    // Enter on the drop zone opens the file picker, as a click would (the click is seen, and the dialog kept shut).
    await page.evaluate(`document.querySelector('input[type="file"]').addEventListener("click", (e) => { e.preventDefault(); document.body.dataset.picked = "yes"; })`);
    await page.keyboard.press("Enter");
    await page.waitForSelector('body[data-picked="yes"]', { timeout: 5_000 });
    expect(problems).to.deep.equal([]);
  });

  it("streams an n = 4 generation: partial images in the grid before any final, then four finals to download", async () => {
    await open("images");
    await useKey(TOKEN);
    await page.$eval('input[name="n"]', (input) => ((input as unknown as { value: string }).value = "4"));
    await page.$eval('input[name="partialImages"]', (input) => ((input as unknown as { value: string }).value = "2"));
    await page.click('button[type="submit"].primary');
    await page.waitForSelector('.cell[data-state="partial"] img[src^="blob:"]', { timeout: 15_000 });
    await page.waitForFunction('document.querySelectorAll(".cell[data-state=\\"final\\"]").length === 4', { timeout: 20_000 });
    const cells = (await page.evaluate(`[...document.querySelectorAll(".cell")].map((c) => ({
      partials: Number(c.dataset.partials),
      partialAt: Number(c.dataset.partialAt ?? NaN),
      finalAt: Number(c.dataset.finalAt),
      decoded: c.querySelector("img").complete && c.querySelector("img").naturalWidth > 0,
      download: c.querySelector("a.download")?.getAttribute("download") ?? null,
    }))`)) as { partials: number; partialAt: number; finalAt: number; decoded: boolean; download: string | null }[];
    expect(cells.map((c) => c.download)).to.deep.equal(["image-0.png", "image-1.png", "image-2.png", "image-3.png"]);
    expect(cells.every((c) => c.decoded)).to.equal(true);
    expect(cells.reduce((sum, c) => sum + c.partials, 0)).to.be.at.least(1);
    // Every preview was on screen before any final: the first final came after the last first preview.
    const previewed = cells.filter((c) => c.partials > 0);
    expect(previewed.length).to.be.at.least(1);
    expect(Math.max(...previewed.map((c) => c.partialAt))).to.be.below(Math.min(...cells.map((c) => c.finalAt)));
    const summary = (await page.$eval(".summary", (el) => el.textContent)) as string;
    expect(summary).to.match(/idempotency key sent\s*console-[0-9a-f]{32}/);
    expect(summary).to.match(/usage/).and.match(/server timings/);
    await screenshot(page, "images-streamed-1280");
    await page.setViewport({ width: 390, height: 844 });
    await screenshot(page, "images-streamed-390");
    expect(problems).to.deep.equal([]);
  });

  it("shows, for a dropped image, the content hash `mmgate media decode` prints for the same file", async () => {
    const raw = Buffer.alloc(96 * 64 * 3);
    for (let i = 0; i < raw.length; i++) raw[i] = (i * 7 + (i >> 5)) & 0xff;
    const png = await sharp(raw, { raw: { width: 96, height: 64, channels: 3 } }).png().toBuffer();
    const file = join(dir, "sample.png");
    writeFileSync(file, png);
    const cli = await runMmgate(["media", "decode", file, "--addr", server.addr, "--json"]);
    expect(cli.code, cli.stderr).to.equal(0);
    const printed = (JSON.parse(cli.stdout) as { content_hash_key: string }).content_hash_key;
    expect(printed).to.match(/^[0-9a-f]{16}$/);

    await open("media");
    // With the key the page also releases the stored tensor (a mutating call) once it has drawn it.
    await useKey(TOKEN);
    await page.evaluate(`(${DROP_FILE})(${JSON.stringify(png.toString("base64"))}, "sample.png", "image/png")`);
    await page.waitForSelector('[data-field="content-hash"]', { timeout: 15_000 });
    expect(await page.$eval('[data-field="content-hash"]', (el) => el.textContent)).to.equal(printed);
    const shape = (await page.$eval(".media-result .facts", (el) => el.textContent)) as string;
    expect(shape).to.include("[64, 96, 3]").and.include("UINT8");
    // The tensor is drawn from the server's copy, and the descriptor is there to read.
    await page.waitForSelector("canvas.thumb", { timeout: 10_000 });
    expect(await page.$('[data-field="descriptor"]')).to.not.equal(null);
    await screenshot(page, "media-decoded-1280");
    expect(problems).to.deep.equal([]);
  });

  it("follows the relay: `mmgate kv publish` moves the pool's live sequence and its heat map", async () => {
    await open("relay");
    await page.waitForSelector('.pool[data-sequence] [data-field="state"]', { timeout: 15_000 });
    await page.waitForFunction('document.querySelector(".pool [data-field=\\"state\\"]").textContent === "live"', { timeout: 15_000 });
    const before = (await page.$eval(".pool", (el) => ({ ...(el as unknown as { dataset: Record<string, string> }).dataset }))) as Record<string, string>;
    const events = join(dir, "events.jsonl");
    writeFileSync(events, routerEvents(1, 12) + routerEvents(2, 20));
    const published = await runMmgate(["kv", "publish", "--addr", server.addr, "--pool", "default", "--token", TOKEN, events]);
    expect(published.code, published.stderr).to.equal(0);
    await page.waitForFunction(
      `BigInt(document.querySelector(".pool").dataset.sequence) > ${BigInt(before["sequence"] ?? "0")}n && Number(document.querySelector(".pool").dataset.occupied ?? 0) > ${Number(before["occupied"] ?? 0)}`,
      { timeout: 15_000 },
    );
    const occupied = Number(await page.$eval(".pool", (el) => (el as unknown as { dataset: Record<string, string> }).dataset["occupied"]));
    expect(occupied).to.be.at.least(32);
    // The relay counts this page's own pool stream among its open ones.
    await page.waitForFunction('/^[1-9]/.test(document.querySelector(".pool [data-field=\\"subscribers\\"]").textContent)', { timeout: 10_000 });
    await screenshot(page, "relay-after-publish-1280");
    expect(problems).to.deep.equal([]);
  });

  it("says UNAUTHENTICATED when the key typed is not the server's", async () => {
    await open("images");
    await useKey("not-the-server-token-at-all");
    await page.click('button[type="submit"].primary');
    await page.waitForSelector('section[data-view="images"][data-run="done"]', { timeout: 15_000 });
    const message = (await page.$eval(".status .notice.error", (el) => el.textContent)) as string;
    expect(message).to.match(/^UNAUTHENTICATED: invalid bearer token/);
    const failed = (await page.$$eval('.cell[data-state="failed"]', (cells) => cells.length)) as number;
    expect(failed).to.be.greaterThan(0);
    await screenshot(page, "images-unauthenticated-1280");
    // The browser reports the call's 401 itself; nothing else may go wrong.
    expect(problems.filter((p) => !/status of 401/.test(p))).to.deep.equal([]);
  });
});
