import { ImageError } from "../../src/images/core/errors.js";
import { expectRejection, expectThrown } from "../support/index.js";

/** Awaits work that must fail with an ImageError, and returns that error. */
export const rejection = (work: Promise<unknown>): Promise<ImageError> => expectRejection(work, { type: ImageError });

/** The ImageError `work` throws synchronously; fails the test when it throws something else or nothing. */
export const expectThrow = (work: () => unknown): ImageError => expectThrown(work, { type: ImageError });
