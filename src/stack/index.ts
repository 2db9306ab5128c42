/**
 * The whole stack on one machine (`mmgate stack up`, `npm run stack`), as a
 * library an end-to-end suite drives too: startStack starts etcd,
 * nats-server and every mmgate role as its own process on loopback, and the
 * Stack it returns stops them in order, or kills and restarts one role at a
 * time to break the stack on purpose.
 */
import type { RoleKind } from "./configs.js";

export { MAX_WORKERS, MIN_WORKERS, STACK_LOG_LEVELS, startStack } from "./stack.js";
export type { RoleInfo, RoleStartOptions, Stack, StackLogLevel, StackOptions, StopReport } from "./stack.js";
export { ENCODER_POOL, NATS_SUBJECT, RELAY_POOL, ROLE_GRACE_MS, roleConfig, roleSubcommand } from "./configs.js";
export type { Peers, RoleKind } from "./configs.js";
export { makeCertificates, makeToken } from "./certs.js";
export type { StackCertificates } from "./certs.js";
export { prepareDir, readPidFile, StackBusyError, stackLayout } from "./layout.js";
export type { PidFile, StackLayout } from "./layout.js";
export { freePort, MissingToolError, natsGreets, pidAlive, portInUse, RoleStartError } from "./processes.js";
export type { ExitStatus } from "./processes.js";
export { gradientPng, sampleRequest, SAMPLE_EVENTS } from "./samples.js";
export { launcher, shownPath, stackCommands, stackCommandsText, stackTable } from "./table.js";
export { EXIT_INTERRUPTED, stackCommand, stackUp } from "./cli.js";

/** One entry per RoleKind, so that a kind added to the type fails to compile until it is listed here. */
const ROLE_KIND_SET: Readonly<Record<RoleKind, true>> = { etcd: true, nats: true, relay: true, router: true, encoder: true, "token-worker": true, hop: true, images: true };
/** Every kind of process a stack runs; the container and cluster recipes under deploy/ are held to this list. */
export const ROLE_KINDS = Object.freeze(Object.keys(ROLE_KIND_SET)) as readonly RoleKind[];
