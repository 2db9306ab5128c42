/**
 * How the console reaches the services: connect-web's Connect transport to
 * the page's own origin (binary protobuf, so images and tensors travel as
 * bytes), with the key typed in the page sent as a bearer token.
 */
import type { DescService } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";

const KEY_ITEM = "mmgate.console.key";

/** The key lives in sessionStorage: this tab only, gone when it closes; never in localStorage or a cookie. */
export const key = {
  get(): string {
    try {
      return sessionStorage.getItem(KEY_ITEM) ?? "";
    } catch {
      return "";
    }
  },
  set(value: string): void {
    try {
      if (value === "") sessionStorage.removeItem(KEY_ITEM);
      else sessionStorage.setItem(KEY_ITEM, value);
    } catch {
      // Storage refused (a private mode): the key lasts until the page reloads.
      fallbackKey = value;
    }
  },
};
let fallbackKey = "";

const bearer: Interceptor = (next) => (req) => {
  const value = key.get() || fallbackKey;
  if (value !== "") req.header.set("authorization", `Bearer ${value}`);
  return next(req);
};

const transport = createConnectTransport({
  // The page's own origin: the console is served by the server it calls.
  baseUrl: location.origin,
  useBinaryFormat: true,
  interceptors: [bearer],
});

/** A client of one of the server's services. */
export function client<S extends DescService>(service: S): Client<S> {
  return createClient(service, transport);
}

/** UPPER_SNAKE name of a status code, as gRPC tools print it ("UNAUTHENTICATED"). */
export function codeName(code: Code): string {
  return (Code[code] ?? "Unknown").replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

/** A failed call as one line for the page: its code and message, and what to do for the common ones. */
export function describeError(err: unknown): { code: Code; text: string } {
  const e = ConnectError.from(err);
  let text = `${codeName(e.code)}: ${e.rawMessage}`;
  if (e.code === Code.Unauthenticated) {
    text +=
      key.get() === ""
        ? " — enter a key of the server's above (its auth.token, or a key of its auth.keysFile)"
        : " — the key entered above is not one the server knows (its auth.token, or a key of its auth.keysFile), or it expired";
  } else if (e.code === Code.PermissionDenied && key.get() !== "") {
    text += " — the key entered above lacks the scope this needs (mmgate keys list shows each key's scopes)";
  }
  return { code: e.code, text };
}

/** Whether `err` is the end of a call this page cancelled itself (a view closed). */
export function isCancel(err: unknown, signal: AbortSignal): boolean {
  return signal.aborted || ConnectError.from(err).code === Code.Canceled;
}

/**
 * Streams the page may hold open at once. Over HTTP/1.1 a browser keeps at
 * most six connections to a server and each open stream takes one for its
 * life, so the console keeps to a few and leaves room for ordinary calls;
 * over HTTP/2 (TLS) streams share one connection.
 */
export function streamBudget(): number {
  const nav = performance.getEntriesByType("navigation")[0] as PerformanceNavigationTiming | undefined;
  const protocol = nav?.nextHopProtocol ?? "";
  return protocol === "h2" || protocol === "h3" ? 64 : 4;
}

/** Waits `ms`, or less when the signal fires. */
export function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
  });
}
