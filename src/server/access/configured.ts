import { gatherRawConfig } from "../config/index.js";

/**
 * `auth.keysFile` as a config file and the environment set it (MMGATE_AUTH__KEYS_FILE
 * wins), without validating the rest of the config: `mmgate keys` edits
 * the file a server would read, without the modules' schemas. "" when
 * neither sets it.
 */
export function configuredKeysFile(sources: { readonly file?: string | undefined; readonly env: Record<string, string | undefined> }): string {
  const raw = gatherRawConfig({ file: sources.file, env: sources.env });
  const auth = raw.values["auth"];
  const value = typeof auth === "object" && auth !== null ? (auth as Record<string, unknown>)["keysFile"] : undefined;
  return typeof value === "string" ? value : "";
}
