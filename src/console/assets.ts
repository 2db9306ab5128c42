/**
 * The console's files: the page (web/index.html) and the bundle esbuild
 * makes of web/main.ts (its script, its style sheet and their source maps),
 * built in memory the first time the console is asked for and kept for the
 * life of the process. Built from the sources the process runs, so the page
 * always matches the server's contracts (gen/) and nothing built can be stale.
 */
import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { basename } from "node:path";
import { fileURLToPath } from "node:url";
import { rootUrl } from "../paths.js";

/** The folder of the console's browser sources. */
export const WEB_ROOT: URL = new URL("src/console/web/", rootUrl);

/** One file the console serves. */
export interface ConsoleAsset {
  readonly body: Buffer;
  readonly contentType: string;
  /** A strong validator: the body's digest, quoted. */
  readonly etag: string;
}

/** The bundle could not be built (a syntax error in web/, a missing dependency); the message says where. */
export class ConsoleBuildError extends Error {
  override readonly name = "ConsoleBuildError";
}

const CONTENT_TYPES: Readonly<Record<string, string>> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".map": "application/json; charset=utf-8",
  ".svg": "image/svg+xml",
};

function asset(body: Buffer, name: string): ConsoleAsset {
  const ext = name.slice(name.lastIndexOf("."));
  const digest = createHash("sha256").update(body).digest("base64url").slice(0, 22);
  return { body, contentType: CONTENT_TYPES[ext] ?? "application/octet-stream", etag: `"${digest}"` };
}

/** Files served as they are in web/, beside the bundle. */
const STATIC_FILES = ["index.html", "icon.svg"];

/** The page and its bundle, by file name ("index.html", "app.js", "app.css", …). */
export class ConsoleAssets {
  private built: Promise<ReadonlyMap<string, ConsoleAsset>> | undefined;

  constructor(private readonly webRoot: URL = WEB_ROOT) {}

  /** Every file, built once; a failed build is tried again at the next call. */
  get(): Promise<ReadonlyMap<string, ConsoleAsset>> {
    this.built ??= this.build().catch((err: unknown) => {
      this.built = undefined;
      throw err;
    });
    return this.built;
  }

  private async build(): Promise<ReadonlyMap<string, ConsoleAsset>> {
    // Loaded here: a process that never serves the console never loads esbuild.
    const esbuild = await import("esbuild");
    const outdir = fileURLToPath(new URL("out/", this.webRoot));
    let result;
    try {
      result = await esbuild.build({
        absWorkingDir: fileURLToPath(rootUrl),
        entryPoints: { app: fileURLToPath(new URL("main.ts", this.webRoot)) },
        outdir,
        bundle: true,
        format: "esm",
        platform: "browser",
        // Browsers with streaming fetch bodies, which server streams need.
        target: ["chrome105", "firefox110", "safari16"],
        minify: true,
        sourcemap: "linked",
        sourcesContent: false,
        legalComments: "none",
        charset: "utf8",
        write: false,
        logLevel: "silent",
      });
    } catch (err) {
      const errors = (err as { errors?: { text: string; location?: { file: string; line: number } | null }[] }).errors ?? [];
      const first = errors
        .slice(0, 3)
        .map((e) => (e.location ? `${e.location.file}:${e.location.line}: ${e.text}` : e.text))
        .join("; ");
      throw new ConsoleBuildError(`the console's bundle failed to build: ${first || (err as Error).message}`);
    }
    const files = new Map<string, ConsoleAsset>();
    for (const file of result.outputFiles) {
      const name = basename(file.path);
      files.set(name, asset(Buffer.from(file.contents), name));
    }
    if (!files.has("app.js")) throw new ConsoleBuildError("the console's bundle has no app.js");
    for (const name of STATIC_FILES) {
      const body = await readFile(new URL(name, this.webRoot)).catch((err: Error) => {
        throw new ConsoleBuildError(`cannot read the console's ${name}: ${err.message}`);
      });
      files.set(name, asset(body, name));
    }
    return files;
  }
}
