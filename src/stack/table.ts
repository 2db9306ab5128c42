/**
 * What `mmgate stack up` prints once everything serves: a table of the
 * processes (address, admin address, pid, log file), the token, the CA and
 * the state directory, then commands to try against this stack with its
 * real addresses, `--ca` and `--token` filled in.
 */
import { isAbsolute, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { rootUrl } from "../paths.js";
import { NATS_STREAM, NATS_SUBJECT } from "./configs.js";
import type { RoleInfo, Stack } from "./stack.js";

/** `path` relative to `cwd` when it lies below it (shorter to read and paste), absolute otherwise. */
export function shownPath(path: string, cwd: string = process.cwd()): string {
  if (path === "") return "-";
  const rel = relative(cwd, path);
  return rel !== "" && !rel.startsWith("..") && !isAbsolute(rel) ? rel : path;
}

/** A word for a shell: quoted when it holds anything but safe characters. */
function shellWord(word: string): string {
  return /^[A-Za-z0-9_./:=@%+-]+$/.test(word) ? word : `'${word.replace(/'/g, "'\\''")}'`;
}

function columns(rows: readonly (readonly string[])[]): string[] {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows.map((r) => r.map((cell, i) => (i === r.length - 1 ? cell : cell.padEnd(widths[i]!))).join("  ").trimEnd());
}

function what(role: RoleInfo): string {
  switch (role.kind) {
    case "etcd":
      return "etcd (Encode worker registry)";
    case "nats":
      return "nats-server (JetStream on)";
    case "relay":
      return "KV relay, pool default (+NATS)";
    case "router":
      return "router (OverlapService)";
    case "encoder":
      return "Encode worker";
    case "token-worker":
      return "demo token worker";
    case "hop":
      return "encode hop";
    case "images":
      return "image API (reference provider)";
  }
}

/** The table of processes, the token, the CA and the state directory. */
export function stackTable(stack: Stack, cwd: string = process.cwd()): string {
  const rows = [["ROLE", "WHAT", "ADDRESS", "ADMIN", "PID", "LOG"]];
  for (const role of stack.roles) {
    rows.push([role.name, what(role), role.running ? role.url : "(stopped)", role.adminAddress || "-", String(role.pid), shownPath(role.logFile, cwd)]);
  }
  const lines = columns(rows);
  lines.push(
    "",
    `token   ${stack.token}   (${shownPath(stack.tokenFile, cwd)})`,
    `CA      ${stack.tls ? shownPath(stack.caFile, cwd) : "- (--no-tls: every role serves cleartext h2c)"}`,
    `state   ${shownPath(stack.dir, cwd)}   (configs: <role>.yaml, logs: logs/<role>.log)`,
  );
  return `${lines.join("\n")}\n`;
}

/** The commands to try, as argument lists (after `mmgate`), with a comment each. */
export function stackCommands(stack: Stack, cwd: string = process.cwd()): { readonly comment: string; readonly args: readonly string[] }[] {
  const ca = stack.tls ? ["--ca", shownPath(stack.caFile, cwd)] : [];
  const token = ["--token", stack.token];
  const hop = stack.address("hop");
  const relay = stack.address("relay");
  return [
    { comment: "a multimodal request through the hop: encoded by a worker, verified by the token worker", args: ["hop", "generate", shownPath(stack.requestFile, cwd), "--addr", hop, ...ca, ...token] },
    { comment: "the hop's Encode workers (admitted from etcd) and counters", args: ["hop", "status", "--addr", hop, ...ca] },
    { comment: "grpc.health.v1 of the router", args: ["health", "--addr", stack.address("router"), ...ca] },
    { comment: "the relay's pool as a router mirrors it (Ctrl-C to end)", args: ["relay", "watch", relay, ...ca] },
    {
      comment: `router events into the relay's pool over its gRPC ingest (workers publish to JetStream instead: stream ${NATS_STREAM}, subject ${NATS_SUBJECT})`,
      args: ["kv", "publish", "--pool", "default", shownPath(stack.eventsFile, cwd), "--addr", relay, ...ca, ...token],
    },
    { comment: "two images from the reference provider", args: ["images", "generate", "a red fox", "-n", "2", "--out", shownPath(stack.imagesDir, cwd), "--addr", stack.address("images"), ...ca, ...token] },
  ];
}

/** How to run mmgate from `cwd`: `npx mmgate` inside this repository, the executable's path elsewhere. */
export function launcher(cwd: string = process.cwd()): string {
  const root = fileURLToPath(rootUrl);
  const rel = relative(root, cwd);
  return rel === "" || (!rel.startsWith("..") && !isAbsolute(rel)) ? "npx mmgate" : `node ${shellWord(`${root}bin/mmgate.js`)}`;
}

/** The commands to try, as text for a terminal. */
export function stackCommandsText(stack: Stack, cwd: string = process.cwd()): string {
  const lines = ["Try (in another terminal):"];
  const mmgate = launcher(cwd);
  for (const { comment, args } of stackCommands(stack, cwd)) lines.push(`  # ${comment}`, `  ${mmgate} ${args.map(shellWord).join(" ")}`);
  return `${lines.join("\n")}\n`;
}
