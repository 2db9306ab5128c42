import { ImageError } from "../../src/images/core/errors.js";
import { expectRejection } from "../support/index.js";

/** Awaits work that must fail with an ImageError, and returns that error. */
export const rejection = (work: Promise<unknown>): Promise<ImageError> => expectRejection(work, { type: ImageError });
