/** Asserting that work fails, and how. */
import { ConnectError } from "@connectrpc/connect";
import { expect } from "chai";

export interface ExpectedFailure<E> {
  /** The error's class. */
  readonly type?: abstract new (...args: never[]) => E;
  /** The error's `code`: a gRPC status number, a Connect `Code`, a Node.js or domain code string. */
  readonly code?: string | number;
  readonly message?: RegExp;
  readonly name?: string;
}

/**
 * Awaits `work` (a promise, or a function that returns one or throws) and
 * asserts that it fails as `expected`; returns the error for further checks.
 * Fails when the work succeeds.
 */
export async function expectRejection<E = Error>(
  work: Promise<unknown> | (() => unknown),
  expected: ExpectedFailure<E> = {},
): Promise<E> {
  let value: unknown;
  try {
    value = await (typeof work === "function" ? work() : work);
  } catch (error) {
    return checkFailure(error, expected);
  }
  expect.fail(`expected a failure, got ${preview(value)}`);
}

/** Runs `work`, which must throw synchronously as `expected`; returns the error for further checks. */
export function expectThrown<E = Error>(work: () => unknown, expected: ExpectedFailure<E> = {}): E {
  let value: unknown;
  try {
    value = work();
  } catch (error) {
    return checkFailure(error, expected);
  }
  expect.fail(`expected a throw, got ${preview(value)}`);
}

function checkFailure<E>(error: unknown, expected: ExpectedFailure<E>): E {
  if (expected.type) expect(error).to.be.instanceOf(expected.type);
  const fields = error as { code?: unknown; message?: unknown; name?: unknown };
  if (expected.code !== undefined) expect(fields.code, `code of ${String(error)}`).to.equal(expected.code);
  if (expected.name !== undefined) expect(fields.name, `name of ${String(error)}`).to.equal(expected.name);
  if (expected.message !== undefined) expect(String(fields.message)).to.match(expected.message);
  return error as E;
}

/** Awaits a call that must fail and returns its status as a ConnectError (whatever was thrown). */
export async function connectErrorOf(work: Promise<unknown> | (() => unknown)): Promise<ConnectError> {
  return ConnectError.from(await expectRejection(work));
}

function preview(value: unknown): string {
  try {
    return JSON.stringify(value, (_k, v: unknown) => (typeof v === "bigint" ? `${v}n` : v))?.slice(0, 200) ?? String(value);
  } catch {
    return String(value);
  }
}
