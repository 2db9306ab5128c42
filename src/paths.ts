/**
 * The repository's root as a URL (trailing slash included), for the files
 * the process reads next to its code: package.json, gen/descriptors.binpb.
 *
 * This module sits one folder below the root, and so does every file of the
 * bundle scripts/build-cli.mjs writes to dist/, whichever chunk this code
 * lands in: "../" is the root both when tsx runs the sources and when the
 * bundle runs. A URL relative to a deeper file's own `import.meta.url` would
 * be wrong in the bundle, so this is the only module that reads it; the
 * build fails when another one does.
 */
export const rootUrl: URL = new URL("..", import.meta.url);
