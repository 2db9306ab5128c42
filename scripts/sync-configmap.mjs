// Rewrites data["mmgate.yaml"] of deploy/kubernetes/configmap.yaml from
// examples/mmgate.yaml (the manifests test holds the two equal); everything
// before `data:` is kept as it is.
import { readFileSync, writeFileSync } from "node:fs";

const root = new URL("..", import.meta.url).pathname;
const configMapPath = `${root}deploy/kubernetes/configmap.yaml`;
const example = readFileSync(`${root}examples/mmgate.yaml`, "utf8");
const configMap = readFileSync(configMapPath, "utf8");
const at = configMap.search(/^data:\n/m);
if (at === -1) throw new Error(`${configMapPath}: no top-level data: key`);
// A block literal keeps the text byte for byte: each line indented, empty lines empty.
const body = example
  .replace(/\n$/, "")
  .split("\n")
  .map((line) => (line === "" ? "" : `    ${line}`))
  .join("\n");
writeFileSync(configMapPath, `${configMap.slice(0, at)}data:\n  mmgate.yaml: |\n${body}\n`);
console.log(`${configMapPath}: data["mmgate.yaml"] is examples/mmgate.yaml`);
