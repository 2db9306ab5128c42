import type { DestinationStream, Logger } from "pino";
import { pino } from "pino";
import type { HostConfig } from "../server/index.js";
import { traceLogFields } from "../telemetry/index.js";

export type LogFormat = HostConfig["log"]["format"];

/** "auto" is pretty for a person at a terminal and JSON for anything that collects logs. */
export function chooseLogFormat(format: LogFormat, stdoutIsTty: boolean): "json" | "pretty" {
  return format === "auto" ? (stdoutIsTty ? "pretty" : "json") : format;
}

/**
 * The pretty destination: pino-pretty in process and writing synchronously,
 * so lines keep their order with the process's other output and nothing is
 * lost at process.exit (a worker-thread transport gives neither). Loaded only
 * when chosen, to keep start-up light for JSON.
 */
export async function prettyDestination(destination: number | NodeJS.WritableStream = 1): Promise<DestinationStream> {
  const { PinoPretty } = await import("pino-pretty");
  return PinoPretty({ destination, sync: true });
}

/** The process's logger, writing to stdout in the configured format. */
export async function createLogger(log: HostConfig["log"], stdoutIsTty = process.stdout.isTTY === true, extra: { traceIds?: boolean } = {}): Promise<Logger> {
  const options = {
    level: log.level,
    base: { pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
    // With tracing on, a line written inside a span names it (trace_id, span_id); off, no mixin runs at all.
    ...(extra.traceIds === true ? { mixin: traceLogFields } : {}),
  };
  return chooseLogFormat(log.format, stdoutIsTty) === "pretty" ? pino(options, await prettyDestination()) : pino(options);
}
