import { InvalidArgumentError, Option } from "commander";

export const DEFAULT_ADDR = "127.0.0.1:50051";

/** Validates HOST:PORT or [IPv6]:PORT for --addr. */
export function parseAddr(value: string): string {
  if (!/^(\[[0-9a-fA-F:.]+\]|[^\s:[\]/]+):\d{1,5}$/.test(value)) {
    throw new InvalidArgumentError("expected HOST:PORT, e.g. 127.0.0.1:50051");
  }
  return value;
}

/** The `--addr HOST:PORT` option every client subcommand takes. */
export function addrOption(): Option {
  return new Option("--addr <host:port>", "server address").default(DEFAULT_ADDR).argParser(parseAddr);
}

/** `--token` for methods that need the bearer token; MMGATE_AUTH_TOKEN is the default. */
export function tokenOption(): Option {
  return new Option("--token <token>", "bearer token for mutating and admin methods").env("MMGATE_AUTH_TOKEN");
}
