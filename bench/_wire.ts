/** HTTP/2 and gRPC framing helpers shared by the benchmarks' servers and clients. */
import type { EventEmitter } from "node:events";

/** A gRPC length-prefixed frame (uncompressed) around an encoded message. */
export function frame(message: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(5 + message.length);
  out[0] = 0;
  out.writeUInt32BE(message.length, 1);
  out.set(message, 5);
  return out;
}

/** Resolves once a stream's buffer has room again, or once one of `ends` says the peer went away. */
export function writable(stream: EventEmitter, ...ends: string[]): Promise<void> {
  const events = ["drain", ...ends];
  return new Promise((resolve) => {
    const done = () => {
      for (const e of events) stream.off(e, done);
      resolve();
    };
    for (const e of events) stream.on(e, done);
  });
}

/** The comma-separated names in an env variable, each one of `known`; all of them when unset. */
export function selected<K extends string>(variable: string, known: readonly K[]): K[] {
  const value = process.env[variable];
  if (value === undefined || value.trim() === "") return [...known];
  const names = value.split(",").map((s) => s.trim());
  const unknown = names.filter((n) => !(known as readonly string[]).includes(n));
  if (unknown.length > 0) throw new Error(`${variable}: unknown ${unknown.join(", ")} (known: ${known.join(", ")})`);
  return known.filter((k) => names.includes(k));
}
