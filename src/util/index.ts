export { AcquireError, Semaphore, type AcquireFailure, type Permit } from "./semaphore.js";
export { delay, errorOf, MAX_TIMER_MS, raceAbort, settleWithin, untilAborted, whenAborted } from "./abort.js";
export { BoundedQueue, type BoundedQueueOptions } from "./bounded-queue.js";
export { observeStream, type StreamObserver } from "./observe-stream.js";
export { registeredMetric } from "./metrics.js";
