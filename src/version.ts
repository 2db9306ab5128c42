import { readFileSync } from "node:fs";
import { rootUrl } from "./paths.js";

/** The package version, read once from package.json. */
export const version: string = (JSON.parse(readFileSync(new URL("package.json", rootUrl), "utf8")) as { version: string }).version;
