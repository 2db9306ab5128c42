/** `mmgate admin`: a client of mmgate.admin.v1.AdminService. */
import { Command, InvalidArgumentError } from "commander";
import { createClient } from "@connectrpc/connect";
import { AdminService, type GetStatusResponse } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import {
  clientTransport,
  connectionContext,
  type ConnectionOptions,
  reportError,
  STATUS_TIMEOUT_MS,
  tokenOption,
  withConnectionOptions,
  withExitCodes,
} from "../rpc/index.js";

/** Where the admin commands write; the process's streams by default. */
export interface AdminCliIo {
  readonly out: { write(text: string): unknown };
  readonly err: { write(text: string): unknown };
}

type Options = ConnectionOptions & { token?: string; json?: boolean };

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
function parseServing(value: string): boolean {
  const v = value.toLowerCase();
  if (v === "on" || v === "true" || v === "serving") return true;
  if (v === "off" || v === "false" || v === "not_serving") return false;
  throw new InvalidArgumentError(`expected on or off, got "${value}"`);
}

/** `mmgate admin status|config|serving|drain`. */
export function adminCommand(io: AdminCliIo = { out: process.stdout, err: process.stderr }): Command {
  const admin = new Command("admin").description("inspect and steer a running server (mmgate.admin.v1.AdminService)");
  // Status and config are probes (a default deadline); serving and drain are acts an operator waits for, as long as it takes.
  const withOptions = (command: Command, defaultTimeoutMs = 0) =>
    withExitCodes(withConnectionOptions(command, { defaultTimeoutMs }).addOption(tokenOption()).option("--json", "print one JSON object"), {
      1: "the call failed (server unreachable, unauthenticated, unknown service, server draining)",
    });
  const callOptions = (o: Options) => (o.token ? { headers: { authorization: `Bearer ${o.token}` } } : {});
  const failed = (command: string, o: Options, err: unknown) => {
    process.exitCode = reportError(io.err, `admin ${command}`, err, connectionContext(o));
  };

  withOptions(admin.command("status").description("print the server's version, uptime, draining flag and each service's health (public)"), STATUS_TIMEOUT_MS).action(
    async (o: Options) => {
      try {
        const s = await createClient(AdminService, clientTransport(o)).getStatus({}, callOptions(o));
        io.out.write(`${o.json ? JSON.stringify(statusJson(s)) : statusText(s)}\n`);
      } catch (err) {
        failed("status", o, err);
      }
    },
  );

  withOptions(admin.command("config").description("print the server's effective configuration, secrets redacted (admin: --token)"), STATUS_TIMEOUT_MS).action(
    async (o: Options) => {
      try {
        const res = await createClient(AdminService, clientTransport(o)).getConfig({}, callOptions(o));
        const config = res.config ?? {};
        io.out.write(`${o.json ? JSON.stringify(config) : JSON.stringify(config, null, 2)}\n`);
      } catch (err) {
        failed("config", o, err);
      }
    },
  );

  withOptions(
    admin
      .command("serving")
      .description("take a service (or, without SERVICE, the whole server) in or out of rotation as grpc.health.v1 reports it (mutating: --token)")
      .argument("<on|off>", "on: back in rotation; off: NOT_SERVING", parseServing)
      .argument("[service]", "fully qualified service name; the whole server when omitted", ""),
  ).action(async (serving: boolean, service: string, o: Options) => {
    try {
      const res = await createClient(AdminService, clientTransport(o)).setServingStatus({ service, serving }, callOptions(o));
      const status = statusName(res.status);
      io.out.write(`${o.json ? JSON.stringify({ service, status }) : `${service === "" ? "(server)" : service}  ${status}`}\n`);
    } catch (err) {
      failed("serving", o, err);
    }
  });

  withOptions(
    admin
      .command("drain")
      .description(
        "drain the server as SIGTERM does: NOT_SERVING, new calls refused, calls in flight get shutdown.graceMs, then it exits 0 (admin: --token)",
      ),
  ).action(async (o: Options) => {
    try {
      const res = await createClient(AdminService, clientTransport(o)).drain({}, callOptions(o));
      const text = res.alreadyDraining ? "already draining" : `draining: calls in flight get ${res.graceMs} ms, then the server exits`;
      io.out.write(`${o.json ? JSON.stringify({ grace_ms: res.graceMs, already_draining: res.alreadyDraining }) : text}
`);
    } catch (err) {
      failed("drain", o, err);
    }
  });

  return admin;
}
