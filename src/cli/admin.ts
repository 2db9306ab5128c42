/**
 * `mmgate admin`: a client of mmgate.admin.v1.AdminService. The service has
 * no drain RPC (a server drains on SIGTERM), so there is no `admin drain`.
 */
import { Command } from "commander";
import { ConnectError, createClient } from "@connectrpc/connect";
import { AdminService, type GetStatusResponse } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { clientTransport, tokenOption, withConnectionOptions, type ConnectionOptions } from "../rpc/index.js";

/** Where the admin commands write; the process's streams by default. */
export interface AdminCliIo {
  readonly out: { write(text: string): unknown };
  readonly err: { write(text: string): unknown };
}

type Options = ConnectionOptions & { token?: string; json?: boolean; timeout: number };

const EXIT_CODES = `
Exit codes:
  0  the call succeeded
  1  the call failed (server unreachable, unauthenticated, unknown service,
     server draining) or the command line is invalid`;

function statusName(status: ServingStatus): string {
  return ServingStatus[status] ?? String(status);
}

function statusJson(s: GetStatusResponse) {
  return {
    version: s.version,
    uptime_seconds: s.uptimeSeconds,
    draining: s.draining,
    services: s.services.map((svc) => ({ name: svc.name, status: statusName(svc.status) })),
  };
}

function statusText(s: GetStatusResponse): string {
  const width = Math.max(0, ...s.services.map((svc) => svc.name.length)) + 2;
  return [
    `version   ${s.version}`,
    `uptime    ${s.uptimeSeconds.toFixed(1)}s`,
    `draining  ${s.draining ? "yes" : "no"}`,
    `services  ${s.services.length}`,
    ...s.services.map((svc) => `  ${svc.name.padEnd(width)}${statusName(svc.status)}`),
  ].join("\n");
}

/** Parses the on|off operand of `admin serving`. */
function parseServing(value: string): boolean | undefined {
  const v = value.toLowerCase();
  if (v === "on" || v === "true" || v === "serving") return true;
  if (v === "off" || v === "false" || v === "not_serving") return false;
  return undefined;
}

/** `mmgate admin status|config|serving`. */
export function adminCommand(io: AdminCliIo = { out: process.stdout, err: process.stderr }): Command {
  const admin = new Command("admin").description("inspect and steer a running server (mmgate.admin.v1.AdminService)");
  const withOptions = (command: Command) =>
    withConnectionOptions(command)
      .addOption(tokenOption())
      .option("--json", "print one JSON object")
      .option("--timeout <ms>", "deadline for the call", (v) => Number(v), 10_000)
      .addHelpText("after", EXIT_CODES);
  const callOptions = (o: Options) => ({
    timeoutMs: o.timeout,
    ...(o.token ? { headers: { authorization: `Bearer ${o.token}` } } : {}),
  });
  const failed = (err: unknown) => {
    io.err.write(`mmgate admin: ${ConnectError.from(err).message}\n`);
    process.exitCode = 1;
  };

  withOptions(admin.command("status").description("print the server's version, uptime, draining flag and each service's health (public)")).action(
    async (o: Options) => {
      try {
        const s = await createClient(AdminService, clientTransport(o)).getStatus({}, callOptions(o));
        io.out.write(`${o.json ? JSON.stringify(statusJson(s)) : statusText(s)}\n`);
      } catch (err) {
        failed(err);
      }
    },
  );

  withOptions(admin.command("config").description("print the server's effective configuration, secrets redacted (admin: --token)")).action(
    async (o: Options) => {
      try {
        const res = await createClient(AdminService, clientTransport(o)).getConfig({}, callOptions(o));
        const config = res.config ?? {};
        io.out.write(`${o.json ? JSON.stringify(config) : JSON.stringify(config, null, 2)}\n`);
      } catch (err) {
        failed(err);
      }
    },
  );

  withOptions(
    admin
      .command("serving")
      .description("take a service (or, without SERVICE, the whole server) in or out of rotation as grpc.health.v1 reports it (mutating: --token)")
      .argument("<on|off>", "on: back in rotation; off: NOT_SERVING")
      .argument("[service]", "fully qualified service name; the whole server when omitted", ""),
  ).action(async (state: string, service: string, o: Options) => {
    const serving = parseServing(state);
    if (serving === undefined) {
      io.err.write(`mmgate admin: expected on or off, got "${state}"\n`);
      process.exitCode = 1;
      return;
    }
    try {
      const res = await createClient(AdminService, clientTransport(o)).setServingStatus({ service, serving }, callOptions(o));
      const status = statusName(res.status);
      io.out.write(`${o.json ? JSON.stringify({ service, status }) : `${service === "" ? "(server)" : service}  ${status}`}\n`);
    } catch (err) {
      failed(err);
    }
  });

  return admin;
}
