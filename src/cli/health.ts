import { Command } from "commander";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { clientTransport, connectionContext, type ConnectionOptions, EXIT, reportError, withConnectionOptions, withExitCodes } from "../rpc/index.js";

/** The deadline of a check (not a watch) when --timeout is not given. */
const CHECK_TIMEOUT_MS = 5000;

/** Exit codes: 0 SERVING, 1 any other status or a failed call, 2 a usage error. */
export function healthCommand(): Command {
  const command = withConnectionOptions(new Command("health").description("check grpc.health.v1 on a server; exits 0 when SERVING"))
    .option("--service <name>", 'fully qualified service name ("" for the whole server)', "")
    .option("--watch", "follow grpc.health.v1 Watch: print each status as it changes, until the server ends the stream or --timeout passes")
    .action(async (opts: ConnectionOptions & { service: string; watch?: boolean }) => {
      const client = createClient(Health, clientTransport(opts));
      if (opts.watch) {
        // Exit code follows the last status seen: 0 SERVING, 1 otherwise.
        let last: ServingStatus | undefined;
        try {
          for await (const res of client.watch({ service: opts.service })) {
            last = res.status;
            process.stdout.write(`${new Date().toISOString()} ${ServingStatus[res.status] ?? String(res.status)}\n`);
          }
        } catch (err) {
          // --timeout ends a watch that saw a status the way the server ending the stream does; anything else is a failure.
          if (!(err instanceof ConnectError && err.code === Code.DeadlineExceeded && last !== undefined)) {
            process.exitCode = reportError(process.stderr, "health", err, connectionContext(opts));
            return;
          }
        }
        process.exitCode = last === ServingStatus.SERVING ? EXIT.ok : EXIT.failure;
        return;
      }
      try {
        // A probe must not hang on a stuck server: a check without --timeout gets CHECK_TIMEOUT_MS.
        const checker = opts.timeout ? client : createClient(Health, clientTransport({ ...opts, timeout: CHECK_TIMEOUT_MS }));
        const res = await checker.check({ service: opts.service });
        process.stdout.write(`${ServingStatus[res.status] ?? String(res.status)}\n`);
        process.exitCode = res.status === ServingStatus.SERVING ? EXIT.ok : EXIT.failure;
      } catch (err) {
        process.exitCode = reportError(process.stderr, "health", err, connectionContext(opts));
      }
    });
  return withExitCodes(command, {
    [EXIT.ok]: "SERVING (with --watch: the last status seen)",
    [EXIT.failure]: `any other status, or the call failed (unknown service, server unreachable, deadline: a check without --timeout gives up after ${CHECK_TIMEOUT_MS / 1000} s)`,
  });
}
