/**
 * A text/event-stream answer over an HTTP/1.1 or HTTP/2 response, using
 * only what both have (writeHead, write, end, 'drain', 'close'). Writes
 * wait while the client is slow, and a comment line goes out when the
 * stream has been quiet for a while, so proxies do not take a long image
 * for a dead connection.
 */
import type { HttpRouteResponse } from "../../server/index.js";
import type { OpenAiApiError } from "./errors.js";

/** The subset of a Node response both protocols share, typed once. */
interface Writable {
  writeHead(status: number, headers: Record<string, string>): unknown;
  write(chunk: string): boolean;
  end(): unknown;
  once(event: "drain" | "close", listener: () => void): unknown;
  removeListener(event: "drain" | "close", listener: () => void): unknown;
  readonly destroyed: boolean;
  readonly writableEnded: boolean;
}

export interface SseOptions {
  /** Quiet time before a keep-alive comment; 0 turns them off. */
  readonly heartbeatMs?: number;
}

export class SseWriter {
  private readonly res: Writable;
  private heartbeat: NodeJS.Timeout | undefined;
  private lastWrite = 0;

  constructor(
    res: HttpRouteResponse,
    private readonly signal: AbortSignal,
    private readonly options: SseOptions = {},
  ) {
    this.res = res as unknown as Writable;
  }

  /** Sends the status and headers; events may follow. */
  open(headers: Record<string, string> = {}): void {
    this.res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      // Reverse proxies that buffer responses would hold the previews back.
      "x-accel-buffering": "no",
      ...headers,
    });
    this.lastWrite = Date.now();
    const every = this.options.heartbeatMs ?? 15_000;
    if (every > 0) {
      // Checked twice a period, so no silence lasts much over `every` (one check a period could let it run to twice that).
      this.heartbeat = setInterval(
        () => {
          if (Date.now() - this.lastWrite >= every && this.writable()) {
            this.res.write(": keep-alive\n\n");
            this.lastWrite = Date.now();
          }
        },
        Math.max(1, Math.floor(every / 2)),
      );
      this.heartbeat.unref();
    }
  }

  private writable(): boolean {
    return !this.res.destroyed && !this.res.writableEnded && !this.signal.aborted;
  }

  /** One event; resolves once the client has room for more, or at once when it has gone away. */
  async event(name: string, data: unknown): Promise<void> {
    await this.send(`event: ${name}\ndata: ${JSON.stringify(data)}\n\n`);
  }

  /** The error event OpenAI's clients raise as an API error, for a failure after the stream began. */
  async error(error: OpenAiApiError): Promise<void> {
    await this.event("error", { type: "error", ...error.body() });
  }

  private async send(text: string): Promise<void> {
    if (!this.writable()) return;
    this.lastWrite = Date.now();
    if (this.res.write(text)) return;
    await new Promise<void>((resolve) => {
      const done = () => {
        this.res.removeListener("drain", done);
        this.res.removeListener("close", done);
        this.signal.removeEventListener("abort", done);
        resolve();
      };
      this.res.once("drain", done);
      this.res.once("close", done);
      this.signal.addEventListener("abort", done, { once: true });
    });
  }

  end(): void {
    if (this.heartbeat !== undefined) clearInterval(this.heartbeat);
    this.heartbeat = undefined;
    if (!this.res.destroyed && !this.res.writableEnded) this.res.end();
  }
}
