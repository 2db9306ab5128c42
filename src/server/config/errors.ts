/** Config errors name the offending field and where the value came from. */
export class ConfigError extends Error {
  override readonly name = "ConfigError";
  constructor(
    message: string,
    readonly issues: readonly string[] = [],
  ) {
    super(issues.length > 0 ? `${message}:\n  ${issues.join("\n  ")}` : message);
  }
}
