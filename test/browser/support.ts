/**
 * A real Chromium for the console's tests: Debian's `chromium` (the test
 * tooling installs it: scripts/ensure-tools.mjs), driven over the DevTools
 * protocol by puppeteer-core, which downloads no browser of its own. A
 * developer machine without it skips these tests; with CI set a missing
 * browser is an error. One browser per test file, a page per test.
 */
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import { connectPathOnly, repoRoot } from "../support/index.js";

/** The browser: MMGATE_CHROMIUM, else Debian's. */
export const CHROMIUM = process.env["MMGATE_CHROMIUM"] ?? "/usr/bin/chromium";

/** Where screenshots go for review (gitignored). */
export const SHOTS_DIR = join(repoRoot, "test-output", "console");

/** For a `before` hook: skips without Chromium on a developer machine; with `CI` set that is an error. */
export function requireChromium(context: Mocha.Context): void {
  if (connectPathOnly) {
    // Browsers speak HTTP/1.1 to a cleartext port, which the lean path never takes: this run would repeat the other.
    context.skip();
  }
  if (existsSync(CHROMIUM)) return;
  if (process.env["CI"]) throw new Error(`chromium is not installed at ${CHROMIUM} (scripts/ensure-tools.mjs installs the Debian package chromium)`);
  console.warn(`    ${CHROMIUM} is missing: skipping the browser tests (apt-get install chromium to run them)`);
  context.skip();
}

export function launchChromium(): Promise<Browser> {
  return puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    // Root has no sandbox; /dev/shm is small in containers.
    args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run", "--no-default-browser-check"],
  });
}

/** What went wrong in a page: console errors, uncaught exceptions, failed loads (not the aborts of calls the page cancelled itself). */
export function watchPage(page: Page): string[] {
  const problems: string[] = [];
  page.on("console", (message) => {
    if (message.type() === "error") problems.push(`console: ${message.text()}`);
  });
  page.on("pageerror", (error) => problems.push(`page error: ${(error as Error).message}`));
  page.on("requestfailed", (request) => {
    const reason = request.failure()?.errorText ?? "";
    if (reason !== "net::ERR_ABORTED") problems.push(`request failed: ${request.url()} ${reason}`);
  });
  return problems;
}

/** A full-page screenshot as test-output/console/NAME.png. */
export async function screenshot(page: Page, name: string): Promise<void> {
  mkdirSync(SHOTS_DIR, { recursive: true });
  await page.screenshot({ path: join(SHOTS_DIR, `${name}.png`) as `${string}.png`, fullPage: true });
}
