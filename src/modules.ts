import { imagesModule } from "./images/index.js";
import { mediaModule } from "./media/index.js";
import type { ServiceModule } from "./server/index.js";

/**
 * Every capability the `mmgate` executable knows. The config's `services`
 * list picks which of them a process runs (all, by default).
 */
export const catalog: readonly ServiceModule[] = [mediaModule, imagesModule];
