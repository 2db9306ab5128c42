/**
 * The throttled proxy (throttled-proxy.ts) as a process of its own, so that
 * a busy test process (a load generator beside it) cannot slow the link:
 * `node --import tsx throttled-proxy-main.ts TARGET BYTES_PER_SECOND`.
 * Prints `{"addr":"127.0.0.1:PORT"}` once listening, `{"delivered":N}`
 * (bytes sent to clients so far) on SIGUSR2, and that line again on
 * SIGTERM, then exits.
 */
import { startThrottledProxy } from "./throttled-proxy.js";

const [target, rate] = process.argv.slice(2);
if (target === undefined || rate === undefined || !(Number(rate) > 0)) {
  process.stderr.write("usage: throttled-proxy-main.ts HOST:PORT BYTES_PER_SECOND\n");
  process.exit(2);
}
const proxy = await startThrottledProxy({ target, bytesPerSecond: Number(rate) });
process.stdout.write(`${JSON.stringify({ addr: proxy.addr })}\n`);
process.on("SIGUSR2", () => process.stdout.write(`${JSON.stringify({ delivered: proxy.delivered() })}\n`));
process.once("SIGTERM", () => {
  const delivered = proxy.delivered();
  void proxy.close().then(() => process.stdout.write(`${JSON.stringify({ delivered })}\n`, () => process.exit(0)));
});
