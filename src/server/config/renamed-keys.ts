/**
 * Keys renamed since they were first published, in one place. The old name
 * still works, with a warning, in every source: the file, MMGATE_*
 * variables, flags, and a raw object handed to resolveConfig. Each source is
 * adopted where it is read, so that a later source still wins (a file's
 * `modules` loses to MMGATE_SERVICES); a source that sets both keeps the new
 * one.
 */
export const RENAMED_KEYS: readonly { readonly old: string; readonly now: string }[] = Object.freeze([
  // `services` held module names from the start.
  { old: "services", now: "modules" },
  // Named as the lean request path is everywhere else: its code, its metric, the client's `leanPath`.
  { old: "rpc.fastPath", now: "rpc.leanPath" },
]);

/** One source's values as the renaming sees them: by dotted key path, named as the source spells them. */
export interface RenamingView {
  has(path: string): boolean;
  /** Moves the value at `from` to `to` (which is unset). */
  move(from: string, to: string): void;
  drop(path: string): void;
  /** How the source names a key: `"services"`, `MMGATE_SERVICES`, `"services" (--services)`. */
  label(path: string): string;
  /** Where the source is, for the warnings: ` in config.yaml`, or "". */
  readonly where: string;
}

/** Renames every old key `view` holds, telling `warn` about each. */
export function adoptRenamedKeys(view: RenamingView, warn: (message: string) => void): void {
  for (const { old, now } of RENAMED_KEYS) {
    if (!view.has(old)) continue;
    if (view.has(now)) {
      warn(`both ${view.label(now)} and its old name ${view.label(old)} are set${view.where}; ${view.label(old)} is ignored`);
      view.drop(old);
    } else {
      warn(`${view.label(old)}${view.where} is the old name of ${view.label(now)}; it still works`);
      view.move(old, now);
    }
  }
}

type Tree = Record<string, unknown>;

function parentOf(tree: Tree, path: string, create: boolean): [Tree, string] | undefined {
  const keys = path.split(".");
  let node = tree;
  for (const key of keys.slice(0, -1)) {
    const next = node[key];
    if (typeof next !== "object" || next === null || Array.isArray(next)) {
      if (!create) return undefined;
      node[key] = {};
    }
    node = node[key] as Tree;
  }
  return [node, keys[keys.length - 1]!];
}

/** A nested object (a config file's values, a raw config) as a RenamingView. */
export function treeView(tree: Tree, where: string): RenamingView {
  return {
    where,
    has: (path) => {
      const at = parentOf(tree, path, false);
      return at !== undefined && Object.hasOwn(at[0], at[1]) && at[0][at[1]] !== undefined;
    },
    move: (from, to) => {
      const [node, key] = parentOf(tree, from, false)!;
      const [target, targetKey] = parentOf(tree, to, true)!;
      target[targetKey] = node[key];
      delete node[key];
    },
    drop: (path) => {
      const at = parentOf(tree, path, false);
      if (at !== undefined) delete at[0][at[1]];
    },
    label: (path) => `"${path}"`,
  };
}

/** Flat maps keyed by a name per path (MMGATE_* variables, flag overrides), moved together, as a RenamingView. */
export function flatView(maps: readonly Record<string, unknown>[], nameOf: (path: string) => string, label: (path: string) => string): RenamingView {
  const primary = maps[0]!;
  return {
    where: "",
    has: (path) => Object.hasOwn(primary, nameOf(path)) && primary[nameOf(path)] !== undefined,
    move: (from, to) => {
      for (const map of maps) {
        if (!Object.hasOwn(map, nameOf(from))) continue;
        map[nameOf(to)] = map[nameOf(from)];
        delete map[nameOf(from)];
      }
    },
    drop: (path) => {
      for (const map of maps) delete map[nameOf(path)];
    },
    label,
  };
}
