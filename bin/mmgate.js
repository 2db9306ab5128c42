#!/usr/bin/env node
// Runs the TypeScript sources directly through tsx's loader, so a clone
// works right after `npm ci` with no build step.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../src/cli/main.ts");
await main(process.argv.slice(2));
