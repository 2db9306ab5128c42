import { ConfigError } from "./config/index.js";
import type { ServiceModule } from "./module.js";

/** One module to build, in dependency order, and whether its services are served. */
export interface PlannedModule {
  readonly module: ServiceModule;
  /** False for a module built only because another requires it. */
  readonly served: boolean;
}

/**
 * Orders the enabled modules after the modules they require (depth first,
 * in the order they are known). A required module that is not enabled is
 * built too, for its exports, without serving its services; a module that is
 * not known, or a cycle, is a config error.
 */
export function planModules(known: readonly ServiceModule[], enabled: readonly string[]): PlannedModule[] {
  const byName = new Map(known.map((m) => [m.name, m]));
  const plan: PlannedModule[] = [];
  const placed = new Set<string>();
  const visiting: string[] = [];
  const visit = (module: ServiceModule, served: boolean) => {
    if (placed.has(module.name)) return;
    if (visiting.includes(module.name)) {
      throw new ConfigError(`modules require each other in a cycle: ${[...visiting, module.name].join(" → ")}`);
    }
    visiting.push(module.name);
    for (const dep of Object.values(module.requires ?? {})) {
      const found = byName.get(dep.name);
      if (found !== dep) throw new ConfigError(`module "${module.name}" requires "${dep.name}", which this executable does not know`);
      visit(dep, enabled.includes(dep.name));
    }
    visiting.pop();
    placed.add(module.name);
    plan.push({ module, served });
  };
  for (const module of known) if (enabled.includes(module.name)) visit(module, true);
  return plan;
}
