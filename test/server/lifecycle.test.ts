import { expect } from "chai";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { get } from "node:http";
import * as http2 from "node:http2";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { pino } from "pino";
import { z } from "zod";
import { Health, HealthCheckResponse_ServingStatus as S } from "../../gen/grpc/health/v1/health_pb.js";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { ErrorDetailSchema } from "../../gen/mmgate/media/v1/media_pb.js";
import {
  bindService,
  ConfigError,
  defineModule,
  loadConfig,
  resolveConfig,
  startHost,
  type ModuleHealth,
  type ServiceModule,
} from "../../src/server/index.js";
import { inProcessTransport } from "../../src/rpc/index.js";
import { connectErrorOf } from "../support/rejection.js";
import { startServer, type InProcessServer } from "../support/server.js";
import { ShapesService } from "../support/shapes-service.js";

function readyz(adminAddr: string): Promise<number> {
  return new Promise((resolve, reject) => {
    get(`http://${adminAddr}/readyz`, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    }).on("error", reject);
  });
}

/** Resolves when `check` holds, polling; for conditions, never for timing. */
async function until(check: () => boolean | Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 5000;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const SHAPES = ShapesService.typeName;

interface StringValue {
  value: string;
}
interface ShapesClient {
  unary(req: StringValue): Promise<StringValue>;
  serverStream(req: StringValue): AsyncIterable<StringValue>;
  clientStream(reqs: AsyncIterable<StringValue>): Promise<StringValue>;
  bidi(reqs: AsyncIterable<StringValue>): AsyncIterable<StringValue>;
}
function shapesClient(transport: Transport): ShapesClient {
  return createClient(ShapesService, transport) as unknown as ShapesClient;
}

class TestModuleError extends Error {}
class UnmappableError extends Error {}

/** Throws what the request names: a typed error its module maps, one its mapper chokes on, a timeout, or a plain one nobody maps. */
function failure(kind: string): Error {
  switch (kind) {
    case "typed":
      return new TestModuleError("typed failure");
    case "unmappable":
      return new UnmappableError("the mapper throws on this");
    case "timeout":
      return new DOMException("the handler's own timer fired", "TimeoutError");
    case "bad-detail":
      // uint64 cannot hold 2^64: the detail cannot be encoded.
      return new ConnectError("range past the end", Code.OutOfRange, undefined, [
        { desc: ErrorDetailSchema, value: { code: "READ_RANGE_INVALID", limit: 10n, actual: 2n ** 64n } },
      ]);
    default:
      return new Error("plain failure with internals");
  }
}

async function* one(value: string): AsyncIterable<StringValue> {
  yield { value };
}

const shapesModule = defineModule({
  name: "shapes",
  description: "one method of each RPC shape, failing as asked",
  configSchema: z.object({}),
  mapError: (error) => {
    if (error instanceof UnmappableError) throw new Error("mapper bug");
    return error instanceof TestModuleError ? new ConnectError(error.message, Code.FailedPrecondition) : undefined;
  },
  create: () => ({
    services: [
      bindService(ShapesService, {
        unary: (req: StringValue) => {
          throw failure(req.value);
        },
        // eslint-disable-next-line require-yield
        async *serverStream(req: StringValue) {
          throw failure(req.value);
        },
        async clientStream(reqs: AsyncIterable<StringValue>) {
          for await (const req of reqs) throw failure(req.value);
          return { value: "" };
        },
        async *bidi(reqs: AsyncIterable<StringValue>) {
          for await (const req of reqs) {
            yield { value: "before" };
            throw failure(req.value);
          }
        },
      } as never),
    ],
  }),
});


async function drainStream(stream: AsyncIterable<unknown>): Promise<void> {
  for await (const _ of stream) void _;
}

describe("host: module lifecycle v2", () => {
  describe("errors become statuses in one place", () => {
    let server: InProcessServer;
    const lines: string[] = [];
    before(async () => {
      server = await startServer({ modules: [shapesModule], logLines: lines });
    });
    after(() => server.close());

    const calls: [string, (c: ShapesClient, kind: string) => Promise<unknown>][] = [
      ["unary", (c, kind) => c.unary({ value: kind })],
      ["server stream", (c, kind) => drainStream(c.serverStream({ value: kind }))],
      ["client stream", (c, kind) => c.clientStream(one(kind))],
      ["bidi stream", (c, kind) => drainStream(c.bidi(one(kind)))],
    ];
    for (const [shape, call] of calls) {
      it(`${shape}: the module's mapper decides the status of its typed errors`, async () => {
        const err = await connectErrorOf(() => call(shapesClient(server.transport), "typed"));
        expect(err.code).to.equal(Code.FailedPrecondition);
        expect(err.rawMessage).to.equal("typed failure");
      });
      it(`${shape}: an error no mapper claims is INTERNAL (never UNKNOWN), logged, and names the request id`, async () => {
        const err = await connectErrorOf(() => call(shapesClient(server.transport), "plain"));
        expect(err.code).to.equal(Code.Internal);
        expect(err.rawMessage).to.match(/^internal error \(request id [0-9a-f-]{36}\)$/);
        expect(err.rawMessage).not.to.contain("internals");
        const id = /request id ([0-9a-f-]+)/.exec(err.rawMessage)![1]!;
        const logged = lines.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === "unmapped error: answering INTERNAL" && l.requestId === id);
        expect(logged, "log line for the unmapped error").to.not.equal(undefined);
        expect((logged!.err as { message: string }).message).to.equal("plain failure with internals");
      });
      it(`${shape}: a mapper that throws does not leak UNKNOWN: INTERNAL`, async () => {
        const err = await connectErrorOf(() => call(shapesClient(server.transport), "unmappable"));
        expect(err.code).to.equal(Code.Internal);
      });
      it(`${shape}: a status whose details cannot be encoded still answers, with its code and message and without the details`, async () => {
        const err = await connectErrorOf(() => call(shapesClient(server.transport), "bad-detail"));
        expect(err.code).to.equal(Code.OutOfRange);
        expect(err.rawMessage).to.equal("range past the end");
        expect(err.details).to.deep.equal([]);
      });
      it(`${shape}: a handler's own TimeoutError answers DEADLINE_EXCEEDED`, async () => {
        const err = await connectErrorOf(() => call(shapesClient(server.transport), "timeout"));
        expect(err.code).to.equal(Code.DeadlineExceeded);
      });
    }

    it("counts the mapped code in the metrics", async () => {
      await connectErrorOf(() => shapesClient(server.transport).unary({ value: "typed" }));
      const text = await server.host.metrics.registry.metrics();
      expect(text).to.match(/grpc_server_handled_total\{[^}]*grpc_method="Unary"[^}]*grpc_code="FAILED_PRECONDITION"[^}]*\} [1-9]/);
    });
  });

  describe("readiness", () => {
    let health: ModuleHealth | undefined;
    let ownEntrySet = false;
    const gated = defineModule({
      name: "gated",
      description: "not ready until told",
      configSchema: z.object({ setOwnEntry: z.boolean().default(false) }),
      create: (ctx) => {
        health = ctx.health;
        ctx.health.setReady(false, "target pending");
        if (ctx.config.setOwnEntry) {
          ownEntrySet = true;
          ctx.health.set(SHAPES, S.SERVING);
        }
        return { services: [bindService(ShapesService, {})] };
      },
    });

    it("derives the server entry and /readyz from the modules' readiness; services follow their module", async () => {
      const server = await startServer({ modules: [gated] });
      try {
        const client = createClient(Health, server.transport);
        expect((await client.check({ service: "" })).status).to.equal(S.NOT_SERVING);
        expect((await client.check({ service: SHAPES })).status).to.equal(S.NOT_SERVING);
        expect((await client.check({ service: Health.typeName })).status).to.equal(S.SERVING);
        expect(await readyz(server.adminAddr)).to.equal(503);

        health!.setReady(true);
        expect((await client.check({ service: "" })).status).to.equal(S.SERVING);
        expect((await client.check({ service: SHAPES })).status).to.equal(S.SERVING);
        expect(await readyz(server.adminAddr)).to.equal(200);

        health!.setReady(false, "lost the target");
        expect((await client.check({ service: "" })).status).to.equal(S.NOT_SERVING);
        expect(await readyz(server.adminAddr)).to.equal(503);
      } finally {
        await server.close();
      }
    });

    it("leaves an entry the module set itself alone", async () => {
      const server = await startServer({ modules: [gated], config: { gated: { setOwnEntry: true } } });
      try {
        expect(ownEntrySet).to.equal(true);
        const client = createClient(Health, server.transport);
        expect((await client.check({ service: SHAPES })).status).to.equal(S.SERVING);
        expect((await client.check({ service: "" })).status).to.equal(S.NOT_SERVING);
      } finally {
        await server.close();
      }
    });

    it("an operator's override and a module's readiness both have to say SERVING", async () => {
      const server = await startServer({ modules: [gated] });
      try {
        const client = createClient(Health, server.transport);
        const admin = createClient(AdminService, server.transport);
        await admin.setServingStatus({ service: "", serving: false });
        health!.setReady(true);
        expect((await client.check({ service: "" })).status).to.equal(S.NOT_SERVING);
        await admin.setServingStatus({ service: "", serving: true });
        expect((await client.check({ service: "" })).status).to.equal(S.SERVING);
      } finally {
        await server.close();
      }
    });
  });

  describe("hooks, tasks and typed dependencies", () => {
    it("runs create, start (routes live), drain (awaited), task stop, close in that order", async () => {
      const events: string[] = [];
      let transport: Transport | undefined;
      const staged = defineModule({
        name: "staged",
        description: "records its lifecycle",
        configSchema: z.object({}),
        create: async (ctx) => {
          events.push("create");
          transport = inProcessTransport({ routes: ctx.localRoutes.routes, interceptors: ctx.localRoutes.interceptors });
          const early = await connectErrorOf(() => createClient(Health, transport!).check({ service: "" }));
          events.push(`early call ${Code[early.code]}`);
          // A stream call too answers UNAVAILABLE, rather than throwing where it is made.
          const earlyStream = await connectErrorOf(() => drainStream(createClient(Health, transport!).watch({ service: "" })));
          events.push(`early stream ${Code[earlyStream.code]}`);
          ctx.tasks.run("watch", async (signal) => {
            events.push("task running");
            await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
            events.push("task stopped");
          });
          return {
            services: [],
            async start() {
              // The routes are live: the module can call the process's own services in memory.
              const res = await createClient(Health, transport!).check({ service: Health.typeName });
              events.push(`start (health ${S[res.status]})`);
            },
            async drain(signal) {
              expect(signal.aborted).to.equal(false);
              await new Promise((r) => setTimeout(r, 20));
              events.push("drain done");
            },
            close: () => void events.push("close"),
          };
        },
      });
      const server = await startServer({ modules: [staged] });
      await server.close();
      expect(events).to.deep.equal(["create", "early call Unavailable", "early stream Unavailable", "task running", "start (health SERVING)", "drain done", "task stopped", "close"]);
    });

    it("in-process calls go through the listener's interceptors: auth included", async () => {
      const token = "in-process-token-0123456789";
      let transport: Transport | undefined;
      const caller = defineModule({
        name: "caller",
        description: "calls an admin method in memory",
        configSchema: z.object({}),
        create: (ctx) => {
          transport = inProcessTransport({ routes: ctx.localRoutes.routes, interceptors: ctx.localRoutes.interceptors });
          return { services: [] };
        },
      });
      const server = await startServer({ modules: [caller], config: { auth: { token } } });
      try {
        const admin = createClient(AdminService, transport!);
        const refused = await connectErrorOf(() => admin.getConfig({}));
        expect(refused.code).to.equal(Code.Unauthenticated);
        const res = await admin.getConfig({}, { headers: { authorization: `Bearer ${token}` } });
        expect((res.config as { auth: { token: string } }).auth.token).to.equal("<redacted>");
      } finally {
        await server.close();
      }
    });

    it("restarts a task that throws, counts the restarts, and stops it on drain", async () => {
      let runs = 0;
      let stoppedCleanly = false;
      const flaky = defineModule({
        name: "flaky",
        description: "a task that fails twice",
        configSchema: z.object({}),
        create: (ctx) => {
          ctx.tasks.run(
            "retry-loop",
            async (signal) => {
              runs++;
              if (runs <= 2) throw new Error(`failure ${runs}`);
              await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
              stoppedCleanly = true;
            },
            { minBackoffMs: 1, maxBackoffMs: 5 },
          );
          return { services: [] };
        },
      });
      const lines: string[] = [];
      const server = await startServer({ modules: [flaky], logLines: lines });
      try {
        await until(() => runs === 3, "the third run");
        const text = await server.host.metrics.registry.metrics();
        expect(text).to.contain('mmgate_task_restarts_total{module="flaky",task="retry-loop"} 2');
        const failures = lines.map((l) => JSON.parse(l) as { msg: string; task?: string }).filter((l) => l.msg === "task failed; restarting");
        expect(failures.map((l) => l.task)).to.deep.equal(["retry-loop", "retry-loop"]);
      } finally {
        await server.close();
      }
      expect(stoppedCleanly).to.equal(true);
    });

    const base = defineModule({
      name: "base",
      description: "exports a value and serves Shapes",
      configSchema: z.object({ greeting: z.string().default("hello") }),
      create: (ctx) => ({ services: [bindService(ShapesService, {})], exports: { greet: (name: string) => `${ctx.config.greeting} ${name}` } }),
    });
    let seen = "";
    const dependent = defineModule({
      name: "dependent",
      description: "uses base's exports",
      configSchema: z.object({}),
      requires: { base },
      create: (ctx) => {
        seen = ctx.deps.base.greet("encode worker");
        return { services: [] };
      },
    });

    it("builds a required module first and hands its exports over, typed", async () => {
      // Listed in the reverse order: the host orders by requirement.
      const server = await startServer({ modules: [dependent, base], config: { base: { greeting: "hi" } } });
      try {
        expect(seen).to.equal("hi encode worker");
        const status = await createClient(Health, server.transport).check({ service: SHAPES });
        expect(status.status).to.equal(S.SERVING);
      } finally {
        await server.close();
      }
    });

    it("builds an unlisted requirement for its exports without serving its services", async () => {
      seen = "";
      const server = await startServer({ modules: [dependent, base], config: { modules: ["dependent"] } });
      try {
        expect(seen).to.equal("hello encode worker");
        const err = await connectErrorOf(() => createClient(Health, server.transport).check({ service: SHAPES }));
        expect(err.code).to.equal(Code.NotFound);
      } finally {
        await server.close();
      }
    });

    it("refuses a cycle of requirements with a config error", async () => {
      const a: { requires?: Record<string, ServiceModule> } & ServiceModule = {
        name: "a",
        description: "",
        configSchema: z.object({}),
        create: () => ({ services: [] }),
      };
      const b: ServiceModule = { name: "b", description: "", configSchema: z.object({}), requires: { a }, create: () => ({ services: [] }) };
      (a as { requires?: Record<string, ServiceModule> }).requires = { b };
      const config = resolveConfig({ listen: "127.0.0.1:0", adminListen: "" }, [a, b]);
      const error = await startHost({ config, modules: [a, b], logger: pino({ level: "silent" }), version: "test" }).catch((e: unknown) => e);
      expect(error).to.be.instanceOf(ConfigError);
      expect((error as Error).message).to.equal("modules require each other in a cycle: a → b → a");
    });

    it("a failed start-up releases the port even while a client holds a connection open", async () => {
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      const failing = defineModule({
        name: "failing",
        description: "",
        configSchema: z.object({}),
        create: async () => {
          await gate;
          throw new Error("create failed");
        },
      });
      const probe = net.createServer();
      await new Promise<void>((r) => probe.listen(0, "127.0.0.1", r));
      const port = (probe.address() as net.AddressInfo).port;
      await new Promise<void>((r) => probe.close(() => r()));
      const config = resolveConfig({ listen: `127.0.0.1:${port}`, adminListen: "" }, [failing]);
      const starting = startHost({ config, modules: [failing], logger: pino({ level: "silent" }), version: "test" }).catch((e: unknown) => e);
      // A load balancer's probe connects while the modules are being built.
      const session = http2.connect(`http://127.0.0.1:${port}`);
      session.on("error", () => undefined);
      await new Promise<void>((resolve) => session.once("connect", () => resolve()));
      release();
      expect(((await starting) as Error).message).to.equal("create failed");
      session.destroy();
    });

    it("stops the tasks of modules that started when a later module fails", async () => {
      let taskStopped = false;
      const first = defineModule({
        name: "first",
        description: "",
        configSchema: z.object({}),
        create: (ctx) => {
          ctx.tasks.run("loop", (signal) => new Promise<void>((r) => signal.addEventListener("abort", () => ((taskStopped = true), r()), { once: true })));
          return { services: [] };
        },
      });
      const second = defineModule({
        name: "second",
        description: "",
        configSchema: z.object({}),
        create: () => ({
          services: [],
          start: () => {
            throw new Error("cannot register");
          },
        }),
      });
      const config = resolveConfig({ listen: "127.0.0.1:0", adminListen: "" }, [first, second]);
      const error = await startHost({ config, modules: [first, second], logger: pino({ level: "silent" }), version: "test" }).catch((e: unknown) => e);
      expect((error as Error).message).to.equal("cannot register");
      expect(taskStopped).to.equal(true);
    });
  });

  describe("config", () => {
    const relayLike = defineModule({
      name: "relay",
      description: "reads the reference's variable names",
      configSchema: z.strictObject({ listen: z.string().default(""), maxStreams: z.number().int().positive().default(10) }),
      env: { DYN_RELAY_LISTEN: "listen", DYN_RELAY_MAX_STREAMS: "maxStreams" },
      create: () => ({ services: [] }),
    });

    it("honours a module's own environment names, and MMGATE_* over them", () => {
      const config = loadConfig({ env: { DYN_RELAY_LISTEN: "0.0.0.0:7000", DYN_RELAY_MAX_STREAMS: "25" } }, [relayLike]);
      expect(config.sections.relay).to.deep.equal({ listen: "0.0.0.0:7000", maxStreams: 25 });
      const both = loadConfig({ env: { DYN_RELAY_MAX_STREAMS: "25", MMGATE_RELAY__MAX_STREAMS: "30" } }, [relayLike]);
      expect((both.sections.relay as { maxStreams: number }).maxStreams).to.equal(30);
    });

    it("names a module's variable in its errors", () => {
      expect(() => loadConfig({ env: { DYN_RELAY_MAX_STREAMS: "-1" } }, [relayLike])).to.throw(ConfigError, /relay\.maxStreams: .* \(from DYN_RELAY_MAX_STREAMS\)/);
    });

    it("an old name set by a later source still beats the new name from an earlier one", () => {
      const dir = mkdtempSync(join(tmpdir(), "mmgate-config-"));
      const file = join(dir, "config.yaml");
      writeFileSync(file, "modules: [relay, shapes]\n");
      try {
        const modules = [relayLike, shapesModule];
        expect(loadConfig({ file, env: { MMGATE_SERVICES: "shapes" } }, modules).modules).to.deep.equal(["shapes"]);
        expect(loadConfig({ file, overrides: { services: "relay" } }, modules).modules).to.deep.equal(["relay"]);
        const fileOld = join(dir, "old.yaml");
        writeFileSync(fileOld, "services: [shapes]\n");
        const warnings: string[] = [];
        expect(loadConfig({ file: fileOld, onWarning: (w) => warnings.push(w) }, modules).modules).to.deep.equal(["shapes"]);
        expect(warnings).to.deep.equal([`"services" in ${fileOld} is the old name of "modules"; it still works`]);
        expect(loadConfig({ file: fileOld, env: { MMGATE_MODULES: "relay" } }, modules).modules).to.deep.equal(["relay"]);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });

    it("takes the old `services` key with a warning", () => {
      const warnings: string[] = [];
      const config = loadConfig({ env: { MMGATE_SERVICES: "relay" }, onWarning: (w) => warnings.push(w) }, [relayLike, shapesModule]);
      expect(config.modules).to.deep.equal(["relay"]);
      expect(warnings).to.deep.equal(["MMGATE_SERVICES is the old name of MMGATE_MODULES; it still works"]);
      const listed = loadConfig({ env: { MMGATE_MODULES: "shapes" } }, [relayLike, shapesModule]);
      expect(listed.modules).to.deep.equal(["shapes"]);
    });

    it("takes the old `rpc.fastPath` key and MMGATE_RPC__FAST_PATH with a warning", () => {
      const dir = mkdtempSync(join(tmpdir(), "mmgate-config-"));
      const file = join(dir, "old.yaml");
      writeFileSync(file, "rpc:\n  fastPath: false\n");
      try {
        const warnings: string[] = [];
        expect(loadConfig({ file, onWarning: (w) => warnings.push(w) }, []).rpc.leanPath).to.equal(false);
        expect(warnings).to.deep.equal([`"rpc.fastPath" in ${file} is the old name of "rpc.leanPath"; it still works`]);
        warnings.length = 0;
        expect(loadConfig({ env: { MMGATE_RPC__FAST_PATH: "false" }, onWarning: (w) => warnings.push(w) }, []).rpc.leanPath).to.equal(false);
        expect(warnings).to.deep.equal(["MMGATE_RPC__FAST_PATH is the old name of MMGATE_RPC__LEAN_PATH; it still works"]);
        // The new name wins over the old one in the same source, and a later source's old name over an earlier new one.
        warnings.length = 0;
        expect(loadConfig({ env: { MMGATE_RPC__FAST_PATH: "false", MMGATE_RPC__LEAN_PATH: "true" }, onWarning: (w) => warnings.push(w) }, []).rpc.leanPath).to.equal(true);
        expect(warnings).to.deep.equal(["both MMGATE_RPC__LEAN_PATH and its old name MMGATE_RPC__FAST_PATH are set; MMGATE_RPC__FAST_PATH is ignored"]);
        writeFileSync(file, "rpc:\n  leanPath: false\n");
        expect(loadConfig({ file, env: { MMGATE_RPC__FAST_PATH: "true" } }, []).rpc.leanPath).to.equal(true);
        expect(loadConfig({ env: {} }, []).rpc.leanPath).to.equal(true);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  });
});
