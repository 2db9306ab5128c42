// Types of bin/dist.js, for the tests and benchmarks that import it.
export declare const BUILD_INPUTS: readonly string[];
export declare const DIST_ENTRY: string;
export declare const DIST_STAMP: string;
export declare const repoRoot: string;
export declare function newestMtime(path: string, limit?: number): number;
export declare function isFresh(root?: string): boolean;
export declare function builtEntry(root?: string): URL | undefined;
