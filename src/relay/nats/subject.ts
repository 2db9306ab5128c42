/** NATS subjects and JetStream names, as config validates them. */
import { z } from "zod";

/** One token of a subject: no whitespace, no dot; `*` and `>` only as whole tokens. */
const SUBJECT_TOKEN = /^(?:\*|>|[^\s.*>]+)$/;

/** Why `subject` is not a NATS subject (wildcards allowed), or undefined when it is one. */
export function subjectProblem(subject: string): string | undefined {
  if (subject === "") return "must not be empty";
  const tokens = subject.split(".");
  for (const [i, token] of tokens.entries()) {
    if (token === "") return "must not have an empty token (a leading, trailing or doubled '.')";
    if (!SUBJECT_TOKEN.test(token)) return `token ${JSON.stringify(token)} has whitespace, or a wildcard that is not a whole token`;
    if (token === ">" && i !== tokens.length - 1) return "'>' may only be the last token";
  }
  return undefined;
}

/** A NATS subject, wildcards allowed; the error says what is wrong with it. */
export const natsSubjectSchema = z.string().superRefine((subject, ctx) => {
  const problem = subjectProblem(subject);
  if (problem !== undefined) ctx.addIssue({ code: "custom", message: `not a NATS subject: ${problem}` });
});

/**
 * A JetStream stream or consumer name: the server refuses whitespace, `.`,
 * `*`, `>` and path separators in one (it names files and API subjects).
 */
export const jetStreamNameSchema = z
  .string()
  .min(1)
  .max(255)
  .regex(/^[^\s.*>/\\]+$/, "a JetStream name has no whitespace, '.', '*', '>', '/' or '\\'");
