import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { expect } from "chai";
import { builtinModules, MODULES, modulesOf } from "../../src/modules.js";
import { serveRoles } from "../../src/cli/serve.js";

const srcDir = new URL("../../src/", import.meta.url).pathname;

/** Every `name` given to defineModule in src/, read from the sources. */
function definedModuleNames(): string[] {
  const names: string[] = [];
  const walk = (dir: string): void => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith(".ts")) {
        for (const match of readFileSync(path, "utf8").matchAll(/defineModule\(\{\s*name:\s*"([^"]+)"/g)) names.push(match[1]!);
      }
    }
  };
  walk(srcDir);
  return names.sort();
}

describe("cli: the module table (src/modules.ts)", () => {
  it("lists every module src/ defines, once", () => {
    const listed = MODULES.map((e) => e.module.name);
    expect(new Set(listed).size).to.equal(listed.length);
    expect(definedModuleNames()).to.deep.equal([...listed].sort());
  });

  it("gives serve its modules, and every role command only modules of the table", () => {
    expect(builtinModules.map((m) => m.name)).to.deep.equal(modulesOf("serve").map((m) => m.name));
    const known = new Set(MODULES.map((e) => e.module.name));
    for (const role of serveRoles) {
      for (const name of role.modules) expect(known.has(name), `${role.name}: ${name}`).to.equal(true);
    }
  });

  it("runs the router only under `mmgate router`", async () => {
    expect(builtinModules.map((m) => m.name)).to.not.include("router");
    const router = serveRoles.find((r) => r.name === "router");
    expect((await router!.extraModules!()).map((m) => m.name)).to.deep.equal(["router"]);
  });
});
