// `mmgate images`, split by job: the command and its options (command.ts), a generate call
// (generate.ts), the --out directory (output-dir.ts), what is printed (render.ts), the progress
// bars (progress.ts).
export { imagesCommand } from "./command.js";
export type { CliIo } from "./io.js";
export { cliHint, sizeRule } from "./render.js";
