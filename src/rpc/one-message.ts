/**
 * A request stream of exactly one message, as a server-streaming call sends
 * it: any transport iterates it like any async iterable, and the lean
 * client transport takes the message as it is, without an iteration (an
 * async generator per call, and two of its promises).
 */
export class OneMessage<T> implements AsyncIterable<T> {
  constructor(readonly message: T) {}

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    yield this.message;
  }
}
