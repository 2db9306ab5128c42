export { AcquireError, Semaphore, type AcquireFailure, type Permit } from "./semaphore.js";
export { raceAbort, untilAborted } from "./abort.js";
