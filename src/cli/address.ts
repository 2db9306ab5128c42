import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import type { Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import type { Command } from "commander";
import { InvalidArgumentError, Option } from "commander";
import { hostPort, splitHostPort } from "../server/index.js";

export const DEFAULT_ADDR = "127.0.0.1:50051";

/** Validates HOST:PORT or [IPv6]:PORT for --addr, by the rule the config's listen addresses follow. */
export function parseAddr(value: string): string {
  const parsed = hostPort.safeParse(value);
  if (!parsed.success) throw new InvalidArgumentError(parsed.error.issues[0]?.message ?? "expected HOST:PORT");
  return value;
}

/** The `--addr HOST:PORT` option every client subcommand takes (MMGATE_ADDR as the default). */
export function addrOption(): Option {
  return new Option("--addr <host:port>", "server address").default(DEFAULT_ADDR).env("MMGATE_ADDR").argParser(parseAddr);
}

/** `--token` for methods that need the bearer token; MMGATE_AUTH_TOKEN is the default. */
export function tokenOption(): Option {
  return new Option("--token <token>", "bearer token for mutating and admin methods").env("MMGATE_AUTH_TOKEN");
}

/** What a client subcommand needs to reach a server. */
export interface ConnectionOptions {
  addr: string;
  /** Connect with TLS (implied by --ca). */
  tls?: boolean;
  /** PEM file of the CA that signed the server's certificate; the system CAs otherwise. */
  ca?: string;
}

export function tlsOption(): Option {
  return new Option("--tls", "connect with TLS (the server has tls.certFile set)");
}

export function caOption(): Option {
  return new Option("--ca <file>", "PEM CA certificate to trust for --tls (implies --tls)");
}

/** Adds --addr, --tls and --ca to a client subcommand. */
export function withConnectionOptions(command: Command): Command {
  return command.addOption(addrOption()).addOption(tlsOption()).addOption(caOption());
}

/** A gRPC transport to the server the options name: h2c, or TLS with --tls / --ca. */
export function clientTransport(options: ConnectionOptions): Transport {
  const secure = options.tls === true || options.ca !== undefined;
  if (!secure) return createGrpcTransport({ baseUrl: `http://${options.addr}` });
  let ca: Buffer | undefined;
  if (options.ca !== undefined) {
    try {
      ca = readFileSync(options.ca);
    } catch (err) {
      throw new InvalidArgumentError(`--ca: cannot read ${options.ca}: ${(err as Error).message}`);
    }
  }
  // No SNI for an IP address (TLS forbids it); the certificate is still checked against the address.
  const { host } = splitHostPort(options.addr);
  const servername = isIP(host) ? { servername: "" } : {};
  return createGrpcTransport({ baseUrl: `https://${options.addr}`, nodeOptions: { ...servername, ...(ca ? { ca } : {}) } });
}
