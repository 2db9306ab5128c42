import { expect } from "chai";
import { ImageError } from "../../src/images/core/errors.js";

/** Awaits a promise that must reject with an ImageError, and returns that error. */
export async function rejection(promise: Promise<unknown>): Promise<ImageError> {
  try {
    await promise;
  } catch (error) {
    expect(error).to.be.instanceOf(ImageError);
    return error as ImageError;
  }
  throw new Error("expected a rejection");
}
