/**
 * JetStream API errors as the nats client gives them: a NatsError whose
 * `api_error.err_code` is the server's code.
 */

/** The JetStream API error code of `error`; undefined when it carries none. */
export function jetStreamErrorCode(error: unknown): number | undefined {
  const api = (error as { api_error?: { err_code?: unknown } } | undefined)?.api_error;
  return typeof api?.err_code === "number" ? api.err_code : undefined;
}

/**
 * JetStream's answers to creating a stream that another client created
 * between this one's lookup and its create: "stream name already in use"
 * (10058), and, when the two creates race, now and then "subjects overlap
 * with an existing stream" (10065). The latter is also the answer when
 * another stream holds the subjects: look the stream up again to tell.
 */
const CREATED_MEANWHILE_CODES: ReadonlySet<number> = new Set([10058, 10065]);

/** Whether a stream create was refused as another client's create of the same stream would make it be. */
export function streamCreatedMeanwhile(error: unknown): boolean {
  const code = jetStreamErrorCode(error);
  return code !== undefined && CREATED_MEANWHILE_CODES.has(code);
}

/**
 * "No responders" (the client's 503): nothing took the request. A stream's
 * subjects had no listener (a stream being set up or moving its leader) or
 * the JetStream API none: the operation did not happen, so trying it again
 * is safe.
 */
export function noResponders(error: unknown): boolean {
  return (error as { code?: unknown } | undefined)?.code === "503";
}
