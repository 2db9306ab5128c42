export { AcquireError, Semaphore, type AcquireFailure, type Permit } from "./semaphore.js";
export { delay, errorOf, linkSignals, MAX_TIMER_MS, raceAbort, settleWithin, untilAborted, whenAborted, type LinkedSignal } from "./abort.js";
export { BoundedQueue, type BoundedQueueOptions } from "./bounded-queue.js";
export { observeStream, type StreamObserver } from "./observe-stream.js";
export { registeredMetric } from "./metrics.js";
export { DEFAULT_SLICE_BUDGET, WorkSlicer, type SliceBudget, type SlicerStats } from "./slicer.js";
export { boundedLines, LineTooLongError } from "./lines.js";
export { backoffDelay, backoffOptions, DEFAULT_BACKOFF, interruptibleWait, type BackoffOptions, type Wait, type WaitEnd } from "./backoff.js";
export { childPath, DEFAULT_JSON_LIMITS, isJsonObject, JsonError, newJsonObject, parseJson, stringifyJson, type JsonErrorCode, type JsonLimits, type JsonObject, type JsonValue } from "./json.js";
