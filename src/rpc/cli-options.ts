import type { Transport } from "@connectrpc/connect";
import type { Command } from "commander";
import { InvalidArgumentError, Option } from "commander";
import { hostPort } from "../server/index.js";
import { createChannel } from "./channel.js";
import { ChannelConfigError, MAX_MESSAGE_LIMIT_BYTES, channelDefaults } from "./config.js";

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

/**
 * A channel to the server the options name: h2c, or TLS with --tls / --ca.
 * Message sizes are bounded only by what a server can be configured to
 * send. An unreadable --ca file is a usage error naming the flag.
 */
export function clientTransport(options: ConnectionOptions): Transport {
  try {
    return createChannel(options.addr, {
      ...channelDefaults,
      tls: options.tls === true || options.ca !== undefined,
      caFile: options.ca ?? "",
      maxReceiveMessageBytes: MAX_MESSAGE_LIMIT_BYTES,
      maxSendMessageBytes: MAX_MESSAGE_LIMIT_BYTES,
    });
  } catch (err) {
    if (err instanceof ChannelConfigError && err.field === "caFile") throw new InvalidArgumentError(`--ca: ${err.detail}`);
    throw err;
  }
}
