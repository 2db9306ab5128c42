/** Reading the server's and clients' Prometheus metrics in tests. */
import type { Registry } from "prom-client";

/** The value of the first series of metric `name` whose labels include `labels`; 0 when there is none (nothing counted yet). */
export async function metricValue(registry: Registry, name: string, labels: Record<string, string> = {}): Promise<number> {
  const metric = registry.getSingleMetric(name);
  if (!metric) return 0;
  const { values } = await metric.get();
  return values.find((v) => Object.entries(labels).every(([key, want]) => v.labels[key] === want))?.value ?? 0;
}
