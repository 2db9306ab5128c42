/**
 * Tracing off costs a process nothing: none of the SDK (tracer provider,
 * exporters, their protobuf code, resources) is loaded until tracing is
 * turned on, so the garbage collector has none of it to walk on every call.
 * Checked in a fresh process, which loads what `mmgate serve` loads; and the
 * attribute names mmgate writes out are the semantic conventions'.
 */
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { expect } from "chai";
import * as semconv from "@opentelemetry/semantic-conventions";
import * as incubating from "@opentelemetry/semantic-conventions/incubating";
import * as attributes from "../../src/telemetry/attributes.js";

const root = fileURLToPath(new URL("../..", import.meta.url));

/** Loads the serve command and the host, notes the SDK packages loaded, turns tracing on, notes them again. */
const PROBE = `
import { createRequire } from "node:module";
const require = createRequire(import.meta.url);
const SDK = /@opentelemetry[\\\\/](core|resources|sdk-trace-base|sdk-trace-node|exporter-trace-otlp-[a-z]+|otlp-[a-z-]+|semantic-conventions)[\\\\/]/;
const loaded = () => [...new Set(Object.keys(require.cache).map((k) => SDK.exec(k)?.[1]).filter(Boolean))].sort();
await import("./src/cli/serve.ts");
await import("./src/server/index.ts");
const telemetry = await import("./src/telemetry/index.ts");
const off = loaded();
const settings = telemetry.resolveTracingSettings({ enabled: true, endpoint: "http://127.0.0.1:9", protocol: "http/protobuf", serviceName: "probe", sampleRatio: 1 }, {});
const { pino } = await import("pino");
await telemetry.startTracing(settings, { logger: pino({ level: "silent" }), version: "probe" });
const on = loaded();
await telemetry.shutdownTracing();
console.log(JSON.stringify({ off, on }));
`;

describe("telemetry footprint", () => {
  it("loads none of the SDK while tracing is off, and the SDK once it is turned on", async function () {
    this.timeout(30_000);
    const { stdout } = await promisify(execFile)(process.execPath, ["--import", "tsx", "--input-type=module", "-e", PROBE], { cwd: root });
    const { off, on } = JSON.parse(stdout.trim().split("\n").pop()!) as { off: string[]; on: string[] };
    expect(off).to.deep.equal([]);
    expect(on).to.include.members(["core", "resources", "sdk-trace-base", "sdk-trace-node", "exporter-trace-otlp-proto"]);
  });

  it("writes the semantic conventions' attribute names", () => {
    const table: [string, string | undefined][] = [
      [attributes.ATTR_ERROR_TYPE, semconv.ATTR_ERROR_TYPE],
      [attributes.ATTR_HTTP_REQUEST_METHOD, semconv.ATTR_HTTP_REQUEST_METHOD],
      [attributes.ATTR_HTTP_RESPONSE_STATUS_CODE, semconv.ATTR_HTTP_RESPONSE_STATUS_CODE],
      [attributes.ATTR_HTTP_ROUTE, semconv.ATTR_HTTP_ROUTE],
      [attributes.ATTR_NETWORK_PROTOCOL_VERSION, semconv.ATTR_NETWORK_PROTOCOL_VERSION],
      [attributes.ATTR_SERVER_ADDRESS, semconv.ATTR_SERVER_ADDRESS],
      [attributes.ATTR_SERVER_PORT, semconv.ATTR_SERVER_PORT],
      [attributes.ATTR_SERVICE_NAME, semconv.ATTR_SERVICE_NAME],
      [attributes.ATTR_SERVICE_VERSION, semconv.ATTR_SERVICE_VERSION],
      [attributes.ATTR_URL_FULL, semconv.ATTR_URL_FULL],
      [attributes.ATTR_URL_PATH, semconv.ATTR_URL_PATH],
      [attributes.ATTR_URL_SCHEME, semconv.ATTR_URL_SCHEME],
      [attributes.RPC_SYSTEM, incubating.ATTR_RPC_SYSTEM],
      [attributes.RPC_SERVICE, incubating.ATTR_RPC_SERVICE],
      [attributes.RPC_METHOD, incubating.ATTR_RPC_METHOD],
      [attributes.RPC_GRPC_STATUS_CODE, incubating.ATTR_RPC_GRPC_STATUS_CODE],
      [attributes.RPC_CONNECT_ERROR_CODE, incubating.ATTR_RPC_CONNECT_RPC_ERROR_CODE],
    ];
    for (const [ours, theirs] of table) expect(ours).to.equal(theirs);
    // Every name the module exports is in the table.
    expect(Object.keys(attributes)).to.have.length(table.length);
  });
});
