// Pure text functions of the console, without the DOM: unit-tested in Node (test/console/json-text.test.ts).

/**
 * JSON re-indented as text: the descriptor carries u64 values that
 * JSON.parse would round, so it is never parsed here.
 */
export function indentJson(text: string): string {
  let out = "";
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i += 1) {
    const c = text[i]!;
    if (inString) {
      out += c;
      if (c === "\\") out += text[++i] ?? "";
      else if (c === '"') inString = false;
      continue;
    }
    if (c === '"') {
      inString = true;
      out += c;
    } else if (c === "{" || c === "[") {
      const close = c === "{" ? "}" : "]";
      const flat = c === "[" ? flatArray(text, i) : undefined;
      if (flat !== undefined) {
        // A list of scalars (a shape, timestamps) stays on one line.
        out += flat.text;
        i = flat.end;
      } else if (text[i + 1] === close) {
        out += c + close;
        i += 1;
      } else {
        depth += 1;
        out += `${c}\n${"  ".repeat(depth)}`;
      }
    } else if (c === "}" || c === "]") {
      depth -= 1;
      out += `\n${"  ".repeat(depth)}${c}`;
    } else if (c === ",") {
      out += `,\n${"  ".repeat(depth)}`;
    } else if (c === ":") {
      out += ": ";
    } else if (!/\s/.test(c)) {
      out += c;
    }
  }
  return out;
}

/** The array opening at `start` on one line ("[1, 2, 3]") when it holds no object or array, with the index of its "]". */
function flatArray(text: string, start: number): { text: string; end: number } | undefined {
  let out = "[";
  let inString = false;
  for (let i = start + 1; i < text.length; i += 1) {
    const c = text[i]!;
    if (inString) {
      out += c;
      if (c === "\\") out += text[++i] ?? "";
      else if (c === '"') inString = false;
    } else if (c === '"') {
      inString = true;
      out += c;
    } else if (c === "{" || c === "[") {
      return undefined;
    } else if (c === "]") {
      return { text: `${out}]`, end: i };
    } else if (c === ",") {
      out += ", ";
    } else if (!/\s/.test(c)) {
      out += c;
    }
  }
  return undefined;
}
