import { encodeHopModule, encodeWorkerModule, tokenWorkerModule } from "./encode/index.js";
import { imagesModule } from "./images/index.js";
import { mediaModule } from "./media/index.js";
import { relayModule } from "./relay/index.js";
import type { ServiceModule } from "./server/index.js";

/**
 * Every capability module the `mmgate` executable knows. The config's
 * `modules` list picks which of them a process runs (all, by default).
 */
export const builtinModules: readonly ServiceModule[] = [mediaModule, imagesModule, encodeWorkerModule, tokenWorkerModule, encodeHopModule, relayModule];
