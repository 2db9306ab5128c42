/** What an observer of a stream of messages hears about its end. */
export interface StreamObserver {
  /** The stream failed: return the error to rethrow (the same one, or a mapped one). */
  error?(error: unknown): unknown;
  /** The stream yielded a message. */
  value?(): void;
  /** The stream ended normally, after its last message. */
  end?(): void;
  /** The consumer stopped reading before the end. */
  cancel?(): void;
}

/**
 * Passes `source` through unchanged while telling `observer` how it ended:
 * the one wrapper behind every interceptor that maps or counts the outcome
 * of a streamed response. Iterator-based rather than a generator, so that an
 * early `return()` reaches the source at once.
 */
export function observeStream<T>(source: AsyncIterable<T>, observer: StreamObserver): AsyncIterable<T> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<T> {
      const it = source[Symbol.asyncIterator]();
      // `then` rather than an async function: one promise per message, not two.
      const onError = (error: unknown) => {
        throw observer.error ? observer.error(error) : error;
      };
      const onResult = (result: IteratorResult<T>) => {
        if (result.done === true) observer.end?.();
        else observer.value?.();
        return result;
      };
      return {
        next: () => {
          let pending: Promise<IteratorResult<T>>;
          try {
            pending = it.next();
          } catch (error) {
            // An iterator that throws instead of rejecting is observed all the same.
            return Promise.reject(error as Error).catch(onError);
          }
          return pending.then(onResult, onError);
        },
        async return(value?: unknown) {
          const result = (await it.return?.(value)) ?? { done: true as const, value: undefined };
          observer.cancel?.();
          return result as IteratorResult<T>;
        },
      };
    },
  };
}
