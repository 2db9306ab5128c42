import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["node_modules/", "gen/", "dist/", ".doc-code/"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      globals: { process: "readonly", console: "readonly", Buffer: "readonly", URL: "readonly", setTimeout: "readonly", clearTimeout: "readonly", setImmediate: "readonly", setInterval: "readonly", clearInterval: "readonly", AbortController: "readonly", AbortSignal: "readonly", performance: "readonly", TextEncoder: "readonly", TextDecoder: "readonly", queueMicrotask: "readonly", structuredClone: "readonly", fetch: "readonly", Response: "readonly", Request: "readonly", Headers: "readonly" },
    },
    rules: {
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "@typescript-eslint/consistent-type-imports": "error",
      "no-constant-condition": ["error", { checkLoops: false }],
    },
  },
  // A folder of src/ is a capability or a shared layer whose index.ts is its
  // public face: other folders import that, never a file behind it (gen/ is
  // generated code, imported directly), dynamic import() included. Only the
  // executable imports src/cli.
  ...[1, 2, 3].map((depth) => {
    const up = "\\.\\./".repeat(depth);
    return {
      files: [`src/${"*/".repeat(depth)}*.ts`],
      rules: {
        "no-restricted-syntax": [
          "error",
          {
            // The same pattern for import(); esquery's regex cannot hold a "/", written \\x2F here.
            selector: `ImportExpression[source.value=/^${"\\.\\.\\x2F".repeat(depth)}(?!\\.\\.|gen\\x2F)[^\\x2F]+\\x2F(?!index\\.js$)./]`,
            message: "Import another folder through its index.ts, its public face (import() too).",
          },
        ],
        "no-restricted-imports": [
          "error",
          {
            patterns: [
              {
                regex: `^${up}(?!\\.\\.|gen/)[^/]+/(?!index\\.js$).+`,
                message: "Import another folder through its index.ts, its public face.",
              },
              { regex: `^${up}cli/`, message: "Capabilities do not import the executable's CLI; shared CLI helpers live in src/rpc." },
            ],
          },
        ],
      },
    };
  }),
  {
    files: ["**/*.cjs"],
    languageOptions: { sourceType: "commonjs", globals: { require: "readonly", module: "writable", process: "readonly" } },
    rules: { "@typescript-eslint/no-require-imports": "off" },
  },
  {
    files: ["test/**/*.ts"],
    rules: { "@typescript-eslint/no-unused-expressions": "off", "@typescript-eslint/no-non-null-assertion": "off" },
  },
);
