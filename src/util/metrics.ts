import type { Metric, Registry } from "prom-client";

/**
 * The metric `name` of `registry`, created by `create` the first time: one
 * process may build several modules or channels on one registry, and a
 * name can be registered only once. A metric of another type under the name
 * is an error, not a silent cast.
 */
export function registeredMetric<T extends Metric>(registry: Registry, name: string, kind: abstract new (...args: never[]) => T, create: () => T): T {
  const found = registry.getSingleMetric(name);
  if (found === undefined) return create();
  if (!(found instanceof kind)) throw new Error(`metric ${name} is registered with another type`);
  return found;
}
