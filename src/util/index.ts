export { AcquireError, Semaphore, type AcquireFailure, type Permit } from "./semaphore.js";
export { untilAborted } from "./drain.js";
