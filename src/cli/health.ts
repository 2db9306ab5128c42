import { Command } from "commander";
import { createClient } from "@connectrpc/connect";
import { ConnectError } from "@connectrpc/connect";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { clientTransport, withConnectionOptions, type ConnectionOptions } from "../rpc/index.js";

/** Exit codes: 0 SERVING, 1 anything else, 2 the call failed. */
export function healthCommand(): Command {
  return withConnectionOptions(new Command("health").description("check grpc.health.v1 on a server; exits 0 when SERVING"))
    .option("--service <name>", 'fully qualified service name ("" for the whole server)', "")
    .option("--timeout <ms>", "deadline for the call (not with --watch)", (v) => Number(v), 5000)
    .option("--watch", "follow grpc.health.v1 Watch: print each status as it changes, until the server ends the stream")
    .action(async (opts: ConnectionOptions & { service: string; timeout: number; watch?: boolean }) => {
      try {
        const client = createClient(Health, clientTransport(opts));
        if (opts.watch) {
          // Exit code follows the last status seen: 0 SERVING, 1 otherwise.
          let last = ServingStatus.UNKNOWN;
          for await (const res of client.watch({ service: opts.service })) {
            last = res.status;
            process.stdout.write(`${new Date().toISOString()} ${ServingStatus[res.status] ?? String(res.status)}\n`);
          }
          process.exitCode = last === ServingStatus.SERVING ? 0 : 1;
          return;
        }
        const res = await client.check({ service: opts.service }, { timeoutMs: opts.timeout });
        const name = ServingStatus[res.status] ?? String(res.status);
        process.stdout.write(`${name}\n`);
        process.exitCode = res.status === ServingStatus.SERVING ? 0 : 1;
      } catch (err) {
        const e = ConnectError.from(err);
        process.stderr.write(`mmgate health: ${e.message}\n`);
        process.exitCode = 2;
      }
    });
}
