import { createChannel, type Channel, type ChannelDeps } from "./channel.js";
import type { ChannelOptions } from "./config.js";

/** Builds one channel; createChannel unless a test says otherwise. */
export type ChannelFactory = (target: string, options: ChannelOptions, deps: ChannelDeps) => Channel;

/**
 * One channel per target, created on first use. When a target leaves
 * (`retain` without it, or `delete`), its channel stops taking calls,
 * lets the ones in flight end, then closes its connection.
 */
export class ChannelPool {
  private readonly channels = new Map<string, Channel>();
  private readonly leaving = new Map<Channel, Promise<void>>();
  private closed = false;

  constructor(
    private readonly options: ChannelOptions,
    private readonly deps: ChannelDeps = {},
    private readonly factory: ChannelFactory = createChannel,
  ) {}

  /** The channel to `target`, created now if there is none. Throws once the pool is closed, or when the channel cannot be built. */
  get(target: string): Channel {
    if (this.closed) throw new Error("the channel pool is closed");
    let channel = this.channels.get(target);
    if (channel === undefined) {
      channel = this.factory(target, this.options, this.deps);
      this.channels.set(target, channel);
    }
    return channel;
  }

  /** Targets with a channel. */
  targets(): string[] {
    return [...this.channels.keys()];
  }

  /** Forgets and closes the channels of every target not in `targets` (e.g. the addresses of the current members). */
  retain(targets: Iterable<string>): void {
    const keep = new Set(targets);
    for (const target of [...this.channels.keys()]) if (!keep.has(target)) this.delete(target);
  }

  /** Forgets `target`'s channel and closes it once its calls have ended; false when there was none. */
  delete(target: string): boolean {
    const channel = this.channels.get(target);
    if (channel === undefined) return false;
    this.channels.delete(target);
    this.leaving.set(
      channel,
      channel.close().finally(() => this.leaving.delete(channel)),
    );
    return true;
  }

  /** Closes every channel (waiting for their calls to end); `get` throws from now on. */
  async close(): Promise<void> {
    this.closed = true;
    for (const target of [...this.channels.keys()]) this.delete(target);
    await Promise.all([...this.leaving.values()]);
  }

  /** Closes every channel now, those still draining too, ending their open calls. */
  abort(reason?: Error): void {
    this.closed = true;
    for (const channel of [...this.channels.values(), ...this.leaving.keys()]) channel.abort(reason);
    this.channels.clear();
  }
}
