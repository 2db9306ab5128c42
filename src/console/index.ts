export { CONSOLE_CSP, CONSOLE_PATH, consoleConfigSchema, consoleModule, consoleRoutes, relayStreams, type ConsoleConfig } from "./module.js";
export { ConsoleAssets, ConsoleBuildError, WEB_ROOT, type ConsoleAsset } from "./assets.js";
