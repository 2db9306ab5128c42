import { Command } from "commander";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { clientTransport, connectionContext, type ConnectionOptions, EXIT, reportError, STATUS_TIMEOUT_MS, withConnectionOptions, withExitCodes } from "../rpc/index.js";

/** Exit codes: 0 SERVING, 1 any other status or a failed call, 2 a usage error. */
export function healthCommand(): Command {
  // A watch follows the server until it ends the stream: no default deadline; a check gets STATUS_TIMEOUT_MS.
  const command = withConnectionOptions(new Command("health").description("check grpc.health.v1 on a server; exits 0 when SERVING"), {
    defaultTimeoutMs: STATUS_TIMEOUT_MS,
  })
    .option("--service <name>", 'fully qualified service name ("" for the whole server)', "")
    .option("--watch", "follow grpc.health.v1 Watch: print each status as it changes, until the server ends the stream or a --timeout given passes")
    .action(async (opts: ConnectionOptions & { service: string; watch?: boolean }, command: Command) => {
      if (opts.watch && command.getOptionValueSource("timeout") === "default") opts.timeout = 0;
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
        const res = await client.check({ service: opts.service });
        process.stdout.write(`${ServingStatus[res.status] ?? String(res.status)}\n`);
        process.exitCode = res.status === ServingStatus.SERVING ? EXIT.ok : EXIT.failure;
      } catch (err) {
        process.exitCode = reportError(process.stderr, "health", err, connectionContext(opts));
      }
    });
  return withExitCodes(command, {
    [EXIT.ok]: "SERVING (with --watch: the last status seen)",
    [EXIT.failure]: `any other status, or the call failed (unknown service, server unreachable, deadline)`,
  });
}
