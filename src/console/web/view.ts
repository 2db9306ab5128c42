import type { DescService } from "@bufbuild/protobuf";

/** What a view gets when it is shown. */
export interface ViewContext {
  /** Fires when the view is left (or the key changes): every call and stream it opened stops. */
  readonly signal: AbortSignal;
  /** Names grpc.health.v1 knows on this server, services and sub-entries; undefined when the list could not be read. */
  readonly served: ReadonlySet<string> | undefined;
}

/** One view of the console, reached at `#/<id>`. */
export interface View {
  readonly id: string;
  readonly title: string;
  /** The services it calls; when the server serves none of the first one, the view says so instead of failing. */
  readonly services: readonly DescService[];
  /** Which module serves them, for the message when they are not running. */
  readonly module: string;
  mount(root: HTMLElement, ctx: ViewContext): void;
}
