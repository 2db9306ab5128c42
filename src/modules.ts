import { consoleModule } from "./console/index.js";
import { encodeHopModule, encodeWorkerModule, tokenWorkerModule } from "./encode/index.js";
import { imagesModule } from "./images/index.js";
import { mediaModule } from "./media/index.js";
import { relayModule, routerModule } from "./relay/index.js";
import type { ServiceModule } from "./server/index.js";

/** A capability module the `mmgate` executable knows (what it serves: its `description`), and the command that runs it. */
export interface ModuleEntry {
  readonly module: ServiceModule;
  /**
   * `serve`: run by `mmgate serve` (all of these when the config names no
   * modules) and the roles that name it; `router`: only by `mmgate router`,
   * since it needs relays to mirror.
   */
  readonly command: "serve" | "router";
}

/** Every capability module, in one table: `serve` and the role commands take theirs from it. */
export const MODULES: readonly ModuleEntry[] = Object.freeze([
  { module: mediaModule, command: "serve" },
  { module: imagesModule, command: "serve" },
  { module: encodeWorkerModule, command: "serve" },
  { module: tokenWorkerModule, command: "serve" },
  { module: encodeHopModule, command: "serve" },
  { module: relayModule, command: "serve" },
  { module: consoleModule, command: "serve" },
  { module: routerModule, command: "router" },
]);

/** The modules of one command. */
export function modulesOf(command: ModuleEntry["command"]): ServiceModule[] {
  return MODULES.filter((e) => e.command === command).map((e) => e.module);
}

/** The modules `mmgate serve` knows; the config's `modules` list picks which of them a process runs (all, by default). */
export const builtinModules: readonly ServiceModule[] = modulesOf("serve");
