import { expect } from "chai";
import { ImageError } from "../../src/images/core/errors.js";
import { expectRejection } from "../support/index.js";

/** Awaits work that must fail with an ImageError, and returns that error. */
export const rejection = (work: Promise<unknown>): Promise<ImageError> => expectRejection(work, { type: ImageError });

/** The ImageError `work` throws synchronously; fails the test when it throws something else or nothing. */
export function expectThrow(work: () => unknown): ImageError {
  try {
    work();
  } catch (error) {
    expect(error).to.be.instanceOf(ImageError);
    return error as ImageError;
  }
  throw new Error("expected a throw");
}
