// Type-checks the TypeScript the documents show (`npm run check:docs`, and
// one of scripts/checks.mjs's checks), so that a code block cannot drift from
// the code it describes.
//
// - Every block fenced ```ts or ```typescript in README.md and docs/**/*.md
//   is written to `.doc-code/run-<pid>/<doc>-<n>.ts` (n counts the document's
//   TypeScript blocks from 1) and compiled against the real sources with the
//   project's tsconfig.json options, as `tsc --noEmit` would: through the
//   compiler API, so only the blocks' own diagnostics are reported (the
//   sources' are the typecheck's), and only what the blocks use is checked.
// - Imports in a block are written as the document would link them:
//   relative to the Markdown file (`../src/server/index.js` from docs/,
//   `./src/server/index.js` from README.md); the script rewrites them to the
//   temporary file's place. Packages are imported by name, as in the sources.
// - A block that is deliberately not a compilable file (a fragment of one) is
//   fenced ```ts fragment: the one opt-out. Use it sparingly.
// - Each block is its own module (an `export {}` is appended), so blocks do
//   not see each other's declarations; strict, NodeNext, verbatimModuleSyntax
//   and noUncheckedIndexedAccess apply as in src/.
//
// Errors name the document and its line: `docs/architecture.md:57:9 (block
// 1): error TS2339: …`. The temporary folder is removed afterwards (kept with
// --keep). Exit 0 when every block compiles, 1 otherwise.
import { mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, relative, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const root = fileURLToPath(new URL("..", import.meta.url));
const keep = process.argv.includes("--keep");

/** README.md and every Markdown file under docs/, as paths relative to the root. */
function documents() {
  const found = ["README.md"];
  const walk = (dir) => {
    for (const entry of readdirSync(join(root, dir), { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const path = `${dir}/${entry.name}`;
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith(".md")) found.push(path);
    }
  };
  walk("docs");
  return found;
}

const FENCE = /^(\s*)(`{3,}|~{3,})(.*)$/;

/**
 * The TypeScript blocks of a document: `{ n, line, code, fragment }`, `line`
 * the 1-based line of the first line of code (the one after the fence).
 */
export function typescriptBlocks(text) {
  const lines = text.split("\n");
  const blocks = [];
  let n = 0;
  for (let i = 0; i < lines.length; i++) {
    const open = FENCE.exec(lines[i]);
    if (!open) continue;
    const [, indent, fence, info] = open;
    // The block runs to a closing fence of the same character, at least as long, with nothing after it.
    let end = i + 1;
    while (end < lines.length) {
      const close = FENCE.exec(lines[end]);
      if (close && close[2][0] === fence[0] && close[2].length >= fence.length && close[3].trim() === "") break;
      end++;
    }
    const words = info.trim().split(/\s+/);
    if (words[0] === "ts" || words[0] === "typescript") {
      n++;
      const code = lines
        .slice(i + 1, end)
        .map((line) => (line.startsWith(indent) ? line.slice(indent.length) : line.trimStart()))
        .join("\n");
      blocks.push({ n, line: i + 2, code, fragment: words.includes("fragment") });
    }
    i = end;
  }
  return blocks;
}

/** A block's relative import specifiers, resolved from its document and made relative to `dir`. */
function rewriteImports(code, doc, dir) {
  const docDir = dirname(join(root, doc));
  const rewrite = (specifier) => {
    if (!specifier.startsWith("./") && !specifier.startsWith("../")) return specifier;
    const target = resolve(docDir, specifier);
    let path = relative(dir, target).split(sep).join("/");
    if (!path.startsWith(".")) path = `./${path}`;
    return path;
  };
  // `from "x"`, `import "x"`, `import("x")`, `import type … from "x"`, `export … from "x"`: one line each.
  return code.replace(/(\bfrom\s*|\bimport\s*\(?\s*)(["'])([^"'\n]+)\2/g, (_, head, quote, specifier) => `${head}${quote}${rewrite(specifier)}${quote}`);
}

function main() {
  const dir = join(root, ".doc-code", `run-${process.pid}`);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  /** Temporary file → where its block is. */
  const origin = new Map();
  let fragments = 0;
  for (const doc of documents()) {
    const name = doc.replace(/\.md$/, "").replace(/^docs\//, "").replaceAll("/", "-");
    for (const block of typescriptBlocks(readFileSync(join(root, doc), "utf8"))) {
      if (block.fragment) {
        fragments++;
        continue;
      }
      const file = join(dir, `${name}-${block.n}.ts`);
      // The appended line makes every block a module of its own; it adds no line before the code.
      writeFileSync(file, `${rewriteImports(block.code, doc, dir)}\nexport {};\n`);
      origin.set(file, { doc, line: block.line, n: block.n });
    }
  }

  const configFile = ts.readConfigFile(join(root, "tsconfig.json"), ts.sys.readFile);
  if (configFile.error) throw new Error(ts.flattenDiagnosticMessageText(configFile.error.messageText, "\n"));
  const parsed = ts.parseJsonConfigFileContent({ ...configFile.config, include: [], files: [...origin.keys()] }, ts.sys, root);
  const program = ts.createProgram({ rootNames: [...origin.keys()], options: { ...parsed.options, noEmit: true } });

  const problems = [];
  const describe = (diagnostic) => `error TS${diagnostic.code}: ${ts.flattenDiagnosticMessageText(diagnostic.messageText, "\n")}`;
  for (const diagnostic of [...program.getOptionsDiagnostics(), ...program.getGlobalDiagnostics()]) problems.push(describe(diagnostic));
  for (const [file, where] of origin) {
    const source = program.getSourceFile(file);
    if (source === undefined) {
      problems.push(`${where.doc}:${where.line} (block ${where.n}): not compiled`);
      continue;
    }
    for (const diagnostic of [...program.getSyntacticDiagnostics(source), ...program.getSemanticDiagnostics(source)]) {
      const { line, character } = source.getLineAndCharacterOfPosition(diagnostic.start ?? 0);
      problems.push(`${where.doc}:${where.line + line}:${character + 1} (block ${where.n}): ${describe(diagnostic)}`);
    }
  }
  if (!keep) {
    rmSync(dir, { recursive: true, force: true });
    // The parent goes too once no other run uses it.
    try {
      rmdirSync(dirname(dir));
    } catch {
      // another run's folder is in it
    }
  }

  const checked = `${origin.size} TypeScript block${origin.size === 1 ? "" : "s"} checked${fragments > 0 ? `, ${fragments} marked fragment` : ""}`;
  if (problems.length > 0) {
    process.stdout.write(`${problems.join("\n")}\n${checked}; ${problems.length} error${problems.length === 1 ? "" : "s"}${keep ? ` (files kept in ${relative(root, dir)})` : ""}\n`);
    return 1;
  }
  process.stdout.write(`${checked}: they compile against the sources\n`);
  return 0;
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) process.exitCode = main();
