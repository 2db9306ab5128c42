/** Reading the server's and clients' Prometheus metrics in tests. */
import type { Registry } from "prom-client";

/**
 * The value of the first series of metric `name` whose labels include
 * `labels`; 0 when there is none (nothing counted yet). A histogram's
 * series are named as Prometheus shows them: `NAME_count`, `NAME_sum`,
 * `NAME_bucket` (with an `le` label).
 */
export async function metricValue(registry: Registry, name: string, labels: Record<string, string> = {}): Promise<number> {
  const suffix = /_(count|sum|bucket)$/.exec(name);
  const own = registry.getSingleMetric(name);
  const metric = own ?? (suffix ? registry.getSingleMetric(name.slice(0, suffix.index)) : undefined);
  if (!metric) return 0;
  const { values } = await metric.get();
  const series = own !== undefined ? values : values.filter((v) => (v as { metricName?: string }).metricName === name);
  return series.find((v) => Object.entries(labels).every(([key, want]) => String(v.labels[key]) === want))?.value ?? 0;
}
