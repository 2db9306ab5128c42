/**
 * The Grafana dashboards under deploy/grafana/ and the alert rules in
 * deploy/prometheus/alerts.yaml, held to the metrics the code registers, so
 * that neither side can drift from the other. The registered metrics are
 * read from a real server running every module (the router and a relay pool
 * with a NATS source included), not from a list: each PromQL expression is
 * tokenized, and every metric name it uses must be registered (a histogram
 * as its _bucket, _sum and _count series), every label in a matcher, a
 * `by (...)` or an `on (...)` must be one the metrics it applies to carry
 * (or `job` / `instance`, the scrape target's), every `{{label}}` of a
 * legend or `$labels.label` of an annotation must survive the expression,
 * rate() and increase() take counters only and histogram_quantile() takes
 * buckets. Label values are checked where the code enumerates them: gRPC
 * service, method and code names, the image error codes, and the values a
 * metric's series already take at start (one-hot gauges and zero-initialised
 * counters list them all). With promtool on PATH the rules also go through
 * `promtool check rules` (so do the dashboards' expressions, as recording
 * rules with Grafana's variables filled in), and `promtool test rules` runs the scenarios
 * below against them (each alert fires when it should, and not when it
 * should not); with CI set, a missing promtool fails (CI installs the Debian
 * package prometheus).
 */
import { expect } from "chai";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code } from "@connectrpc/connect";
import type { Registry } from "prom-client";
import { parse as parseYaml, stringify as stringifyYaml } from "yaml";
import { ERROR_CODES } from "../../src/images/core/errors.js";
import { builtinModules } from "../../src/modules.js";
import { routerModule } from "../../src/relay/router/index.js";
import { codeName } from "../../src/server/index.js";
import { parseDescriptorImage } from "../../src/server/reflection-image.js";
import { repoRoot, startServer, type InProcessServer } from "../support/index.js";

const grafanaDir = join(repoRoot, "deploy", "grafana");
const rulesPath = join(repoRoot, "deploy", "prometheus", "alerts.yaml");

/** One dashboard per area the issue names. */
const AREAS = ["host", "hop", "relay", "images", "media"] as const;

/** Labels Prometheus adds from the scrape target, on every series. */
const TARGET_LABELS: ReadonlySet<string> = new Set(["job", "instance"]);

/**
 * Metrics the code registers only on first use, so a fresh server lacks
 * them. Each is checked against the file that registers it instead.
 */
interface LazyMetric {
  readonly name: string;
  readonly type: "counter" | "gauge";
  readonly labels: readonly string[];
  readonly file: string;
  readonly when: string;
}
const LAZY: readonly LazyMetric[] = [
  {
    name: "mmgate_discovery_errors_total",
    type: "counter",
    labels: ["resolver"],
    file: "src/discovery/etcd.ts",
    when: "when an etcd resolver (encodeHop encoders.discovery etcd) has read its pool from a reachable etcd",
  },
];

/** Labels whose values come from traffic or configuration, not from the code. */
const FREE_VALUED: ReadonlySet<string> = new Set(["grpc_type", "provider", "pool", "relay", "member", "route", "status", "module", "task", "resolver"]);

// ---------------------------------------------------------------- registered metrics

interface Registered {
  readonly type: string;
  readonly labels: ReadonlySet<string>;
  /** The values each label takes in the series present at start. */
  readonly values: ReadonlyMap<string, ReadonlySet<string>>;
}

type Catalog = ReadonlyMap<string, Registered>;

/** Every series name the registry exposes, with its type and labels (a histogram gives _bucket, _sum and _count). */
async function catalogOf(registry: Registry): Promise<Map<string, Registered>> {
  const catalog = new Map<string, Registered>();
  for (const metric of await registry.getMetricsAsJSON()) {
    const declared = (registry.getSingleMetric(metric.name) as unknown as { labelNames?: readonly string[] } | undefined)?.labelNames ?? [];
    const values = new Map<string, Set<string>>();
    for (const series of metric.values) {
      for (const [label, value] of Object.entries(series.labels)) {
        if (label === "le" || label === "quantile") continue;
        if (!values.has(label)) values.set(label, new Set());
        values.get(label)!.add(String(value));
      }
    }
    const labels = new Set([...declared, ...values.keys()]);
    const type = String(metric.type);
    if (type === "histogram" || type === "summary") {
      catalog.set(`${metric.name}_${type === "histogram" ? "bucket" : "quantile"}`, { type, labels: new Set([...labels, type === "histogram" ? "le" : "quantile"]), values });
      if (type === "summary") catalog.set(metric.name, { type, labels: new Set([...labels, "quantile"]), values });
      catalog.set(`${metric.name}_sum`, { type, labels, values });
      catalog.set(`${metric.name}_count`, { type, labels, values });
    } else {
      catalog.set(metric.name, { type, labels, values });
    }
  }
  for (const lazy of LAZY) {
    if (!catalog.has(lazy.name)) catalog.set(lazy.name, { type: lazy.type, labels: new Set(lazy.labels), values: new Map() });
  }
  return catalog;
}

/** `package.Service` → its method names, from the buf image of proto/. */
function protoServices(): Map<string, Set<string>> {
  const services = new Map<string, Set<string>>();
  for (const file of parseDescriptorImage(readFileSync(join(repoRoot, "gen", "descriptors.binpb"))).values()) {
    for (const service of file.service) services.set(`${file.package}.${service.name}`, new Set(service.method.map((m) => m.name)));
  }
  return services;
}

// ---------------------------------------------------------------- PromQL

type TokenKind = "ident" | "string" | "number" | "var" | "punct" | "op";
interface Token {
  readonly kind: TokenKind;
  readonly text: string;
}

const AGGREGATIONS = new Set(["sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"]);
const FUNCTIONS = new Set([
  "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "avg_over_time", "ceil", "changes", "clamp", "clamp_max",
  "clamp_min", "cos", "cosh", "count_over_time", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg", "delta", "deriv", "exp", "floor",
  "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_sum", "holt_winters", "hour", "idelta", "increase", "irate", "label_join",
  "label_replace", "last_over_time", "ln", "log10", "log2", "max_over_time", "min_over_time", "minute", "month", "pi", "predict_linear",
  "present_over_time", "quantile_over_time", "rad", "rate", "resets", "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_desc", "sqrt",
  "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp", "vector", "year",
]);
const GROUPING = new Set(["by", "without"]);
const MATCHING = new Set(["on", "ignoring", "group_left", "group_right"]);
const BINARY_KEYWORDS = new Set(["and", "or", "unless", "bool", "atan2"]);
const COUNTER_FUNCTIONS = new Set(["rate", "irate", "increase", "resets"]);
const OPERATORS = ["=~", "!~", "!=", "==", ">=", "<=", "=", ">", "<", "+", "-", "*", "/", "%", "^", "@", ":"];

function tokenize(expr: string): Token[] {
  const tokens: Token[] = [];
  let i = 0;
  while (i < expr.length) {
    const c = expr[i]!;
    const rest = expr.slice(i);
    if (/\s/.test(c)) {
      i++;
    } else if (c === "#") {
      i = expr.indexOf("\n", i) === -1 ? expr.length : expr.indexOf("\n", i);
    } else if (c === '"' || c === "'" || c === "`") {
      let j = i + 1;
      let text = "";
      while (j < expr.length && expr[j] !== c) {
        if (expr[j] === "\\" && c !== "`") j++;
        text += expr[j];
        j++;
      }
      if (j >= expr.length) throw new Error(`unterminated string in: ${expr}`);
      tokens.push({ kind: "string", text });
      i = j + 1;
    } else if (/^[0-9.]/.test(c)) {
      const m = /^[0-9.][0-9a-zA-Z_.]*(?:[eE][+-]?[0-9]+)?/.exec(rest)!;
      tokens.push({ kind: "number", text: m[0] });
      i += m[0].length;
    } else if (/[a-zA-Z_:]/.test(c)) {
      const m = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(rest)!;
      tokens.push({ kind: "ident", text: m[0] });
      i += m[0].length;
    } else if (c === "$") {
      const m = /^\$(?:\{[^}]+\}|[a-zA-Z0-9_]+)/.exec(rest);
      if (!m) throw new Error(`stray $ in: ${expr}`);
      tokens.push({ kind: "var", text: m[0] });
      i += m[0].length;
    } else if ("(){}[],".includes(c)) {
      tokens.push({ kind: "punct", text: c });
      i++;
    } else {
      const op = OPERATORS.find((o) => rest.startsWith(o));
      if (!op) throw new Error(`unexpected ${JSON.stringify(c)} in: ${expr}`);
      tokens.push({ kind: "op", text: op });
      i += op.length;
    }
  }
  return tokens;
}

interface Matcher {
  readonly label: string;
  readonly op: string;
  readonly value: string;
}
interface MetricUse {
  readonly name: string;
  readonly at: number;
  readonly matchers: readonly Matcher[];
}
interface Aggregation {
  readonly at: number;
  /** Token range of its argument, parentheses included. */
  arg: readonly [number, number];
  labels?: readonly string[];
  without?: boolean;
}
interface Analysis {
  readonly expr: string;
  readonly metrics: readonly MetricUse[];
  readonly aggregations: readonly Aggregation[];
  /** Labels of on (...), ignoring (...), group_left (...), group_right (...). */
  readonly matching: readonly string[];
  /** Calls of rate() and the like, and histogram_quantile(): name and argument range. */
  readonly calls: readonly { name: string; arg: readonly [number, number] }[];
  /** Grafana variables used outside strings and inside matcher values. */
  readonly variables: readonly string[];
}

/** Metric names, matchers, aggregations and label lists of one PromQL expression. */
function analyze(expr: string): Analysis {
  const tokens = tokenize(expr);
  const pair = new Map<number, number>();
  const open: number[] = [];
  const closing: Record<string, string> = { ")": "(", "}": "{", "]": "[" };
  tokens.forEach((t, i) => {
    if (t.kind !== "punct") return;
    if ("({[".includes(t.text)) open.push(i);
    else if (t.text in closing) {
      const j = open.pop();
      if (j === undefined || tokens[j]!.text !== closing[t.text]) throw new Error(`unbalanced ${t.text} in: ${expr}`);
      pair.set(j, i);
      pair.set(i, j);
    }
  });
  if (open.length > 0) throw new Error(`unbalanced brackets in: ${expr}`);
  const is = (i: number, text: string) => tokens[i]?.kind === "punct" && tokens[i]!.text === text;
  const labelList = (i: number): string[] => {
    const labels: string[] = [];
    for (let k = i + 1; k < pair.get(i)!; k++) {
      const t = tokens[k]!;
      if (t.kind === "ident") labels.push(t.text);
      else if (!(t.kind === "punct" && t.text === ",")) throw new Error(`not a label list at ${t.text} in: ${expr}`);
    }
    return labels;
  };

  const metrics: MetricUse[] = [];
  const aggregations = new Map<number, Aggregation>();
  const matching: string[] = [];
  const calls: { name: string; arg: readonly [number, number] }[] = [];
  const variables: string[] = [];
  let i = 0;
  while (i < tokens.length) {
    const t = tokens[i]!;
    if (t.kind === "var") variables.push(t.text);
    if (t.kind === "punct" && t.text === "[") {
      // A range or subquery: durations and variables only.
      for (let k = i + 1; k < pair.get(i)!; k++) {
        const inner = tokens[k]!;
        if (inner.kind === "var") variables.push(inner.text);
        else if (!(inner.kind === "number" || (inner.kind === "op" && inner.text === ":"))) throw new Error(`unexpected ${inner.text} in a range of: ${expr}`);
      }
      i = pair.get(i)! + 1;
      continue;
    }
    if (t.kind === "punct" && t.text === "{") throw new Error(`a selector without a metric name in: ${expr}`);
    if (t.kind !== "ident") {
      i++;
      continue;
    }
    const word = t.text;
    if (GROUPING.has(word) || MATCHING.has(word)) {
      let next = i + 1;
      let labels: string[] = [];
      if (is(next, "(")) {
        labels = labelList(next);
        next = pair.get(next)! + 1;
      } else if (!word.startsWith("group_")) {
        throw new Error(`${word} without a label list in: ${expr}`);
      }
      if (MATCHING.has(word)) {
        matching.push(...labels);
      } else if (tokens[i - 1]?.kind === "ident" && AGGREGATIONS.has(tokens[i - 1]!.text)) {
        // sum by (labels) (argument)
        if (!is(next, "(")) throw new Error(`${tokens[i - 1]!.text} ${word} (...) without an argument in: ${expr}`);
        aggregations.set(i - 1, { at: i - 1, arg: [next, pair.get(next)!], labels, without: word === "without" });
      } else if (is(i - 1, ")") && aggregations.has(pair.get(i - 1)! - 1)) {
        // sum (argument) by (labels)
        const agg = aggregations.get(pair.get(i - 1)! - 1)!;
        agg.labels = labels;
        agg.without = word === "without";
      } else {
        throw new Error(`${word} outside an aggregation in: ${expr}`);
      }
      i = next;
      continue;
    }
    if (BINARY_KEYWORDS.has(word)) {
      i++;
      continue;
    }
    if (word === "offset") {
      i += 2;
      continue;
    }
    if (AGGREGATIONS.has(word) && is(i + 1, "(")) {
      aggregations.set(i, { at: i, arg: [i + 1, pair.get(i + 1)!] });
      i++;
      continue;
    }
    if (AGGREGATIONS.has(word) && tokens[i + 1]?.kind === "ident" && GROUPING.has(tokens[i + 1]!.text)) {
      i++;
      continue;
    }
    if (is(i + 1, "(")) {
      if (!FUNCTIONS.has(word)) throw new Error(`unknown function ${word} in: ${expr}`);
      calls.push({ name: word, arg: [i + 1, pair.get(i + 1)!] });
      i++;
      continue;
    }
    if (/^(inf|nan)$/i.test(word)) {
      i++;
      continue;
    }
    const matchers: Matcher[] = [];
    let next = i + 1;
    if (is(next, "{")) {
      const end = pair.get(next)!;
      let k = next + 1;
      while (k < end) {
        const [label, op, value] = [tokens[k], tokens[k + 1], tokens[k + 2]];
        if (label?.kind !== "ident" || op?.kind !== "op" || !["=", "!=", "=~", "!~"].includes(op.text) || value?.kind !== "string") {
          throw new Error(`not a label matcher in {...} of ${word} in: ${expr}`);
        }
        matchers.push({ label: label.text, op: op.text, value: value.text });
        for (const m of value.text.matchAll(/\$(?:\{[^}]+\}|[a-zA-Z0-9_]+)/g)) variables.push(m[0]);
        k += 3;
        if (k < end && !is(k, ",")) throw new Error(`expected , between matchers of ${word} in: ${expr}`);
        k++;
      }
      next = end + 1;
    }
    metrics.push({ name: word, at: i, matchers });
    i = next;
  }
  return { expr, metrics, aggregations: [...aggregations.values()], matching, calls, variables };
}

const within = (at: number, [from, to]: readonly [number, number]) => at > from && at < to;

/**
 * The labels a result of the expression can carry: the grouping labels of
 * its outermost aggregations, and every label of the metrics used outside
 * any aggregation (target labels included).
 */
function outputLabels(a: Analysis, catalog: Catalog): Set<string> {
  const out = new Set<string>();
  for (const agg of a.aggregations) {
    if (a.aggregations.some((other) => other !== agg && within(agg.at, other.arg))) continue;
    if (agg.without) {
      for (const m of a.metrics.filter((m) => within(m.at, agg.arg))) for (const l of labelsOf(m.name, catalog)) if (!agg.labels?.includes(l)) out.add(l);
    } else {
      for (const l of agg.labels ?? []) out.add(l);
    }
  }
  for (const m of a.metrics) {
    if (a.aggregations.some((agg) => within(m.at, agg.arg))) continue;
    for (const l of labelsOf(m.name, catalog)) out.add(l);
  }
  return out;
}

function labelsOf(name: string, catalog: Catalog): Set<string> {
  return new Set([...(catalog.get(name)?.labels ?? []), ...TARGET_LABELS]);
}

interface Enumerations {
  readonly services: ReadonlyMap<string, ReadonlySet<string>>;
  readonly served: ReadonlySet<string>;
  readonly codes: ReadonlySet<string>;
}

/** What is wrong with one expression against the registered metrics; empty when nothing is. */
function problems(a: Analysis, catalog: Catalog, enums: Enumerations): string[] {
  const found: string[] = [];
  if (a.metrics.length === 0) found.push("uses no metric");
  for (const m of a.metrics) {
    const registered = catalog.get(m.name);
    if (!registered) {
      found.push(`${m.name} is not registered`);
      continue;
    }
    const service = m.matchers.find((x) => x.label === "grpc_service" && x.op === "=")?.value;
    for (const { label, op, value } of m.matchers) {
      if (!labelsOf(m.name, catalog).has(label)) {
        found.push(`${m.name} has no label ${label}`);
        continue;
      }
      if (op !== "=" && op !== "!=") continue;
      let allowed: ReadonlySet<string> | undefined;
      if (label === "grpc_service") allowed = enums.served;
      else if (label === "grpc_method") allowed = service === undefined ? new Set([...enums.services.values()].flatMap((s) => [...s])) : enums.services.get(service);
      else if (label === "grpc_code") allowed = enums.codes;
      else if (m.name === "mmgate_images_requests_total" && label === "code") allowed = new Set(["ok", ...ERROR_CODES]);
      else if (!FREE_VALUED.has(label) && (registered.values.get(label)?.size ?? 0) > 0) allowed = registered.values.get(label);
      if (allowed !== undefined && !allowed.has(value)) found.push(`${m.name}{${label}${op}"${value}"}: no such value (the code has ${[...allowed].sort().join(", ")})`);
    }
  }
  for (const agg of a.aggregations) {
    const inside = a.metrics.filter((m) => within(m.at, agg.arg));
    const available = new Set(inside.flatMap((m) => [...labelsOf(m.name, catalog)]));
    for (const l of agg.labels ?? []) if (!available.has(l)) found.push(`groups by ${l}, which none of ${inside.map((m) => m.name).join(", ")} has`);
  }
  const all = new Set(a.metrics.flatMap((m) => [...labelsOf(m.name, catalog)]));
  for (const l of a.matching) if (!all.has(l)) found.push(`matches on ${l}, which no metric of the expression has`);
  for (const call of a.calls) {
    for (const m of a.metrics.filter((x) => within(x.at, call.arg))) {
      const type = catalog.get(m.name)?.type;
      if (type === undefined) continue;
      if (COUNTER_FUNCTIONS.has(call.name) && !(type === "counter" || type === "histogram" || type === "summary")) found.push(`${call.name}() of ${m.name}, a ${type}`);
      if (call.name === "histogram_quantile" && !m.name.endsWith("_bucket")) found.push(`histogram_quantile() of ${m.name}, not a _bucket series`);
    }
  }
  return found;
}

// ---------------------------------------------------------------- dashboards and rules

interface Target {
  expr?: string;
  legendFormat?: string;
  refId?: string;
  datasource?: { type?: string; uid?: string };
}
interface Panel {
  id: number;
  type: string;
  title: string;
  gridPos: { h: number; w: number; x: number; y: number };
  datasource?: { type?: string; uid?: string };
  targets?: Target[];
  panels?: Panel[];
}
interface Variable {
  name: string;
  type: string;
  query?: string | { query?: string };
  definition?: string;
  datasource?: { type?: string; uid?: string };
}
interface Dashboard {
  uid: string;
  title: string;
  schemaVersion: number;
  panels: Panel[];
  templating: { list: Variable[] };
}

const dashboards: { file: string; dashboard: Dashboard }[] = readdirSync(grafanaDir)
  .filter((f) => f.endsWith(".json"))
  .sort()
  .map((file) => ({ file, dashboard: JSON.parse(readFileSync(join(grafanaDir, file), "utf8")) as Dashboard }));

const panelsOf = (d: Dashboard): Panel[] => d.panels.flatMap((p) => [p, ...(p.panels ?? [])]);

interface Rule {
  alert?: string;
  record?: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}
const rules: Rule[] = (parseYaml(readFileSync(rulesPath, "utf8")) as { groups: { name: string; rules: Rule[] }[] }).groups.flatMap((g) => g.rules);

/** Every PromQL expression of the dashboards and rules, with where it is and the labels its text refers to. */
interface Use {
  readonly where: string;
  readonly expr: string;
  /** Labels a legend or an annotation names: they must survive the expression. */
  readonly shown: readonly string[];
  /** label_values(expr, label): the label. */
  readonly valuesOf?: string;
}

function uses(): Use[] {
  const all: Use[] = [];
  for (const { file, dashboard } of dashboards) {
    for (const v of dashboard.templating.list) {
      if (v.type !== "query") continue;
      const query = typeof v.query === "string" ? v.query : (v.query?.query ?? v.definition ?? "");
      const m = /^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$/s.exec(query.trim());
      if (!m) throw new Error(`${file}: variable ${v.name} is not a label_values(metric, label) query: ${query}`);
      all.push({ where: `${file} variable ${v.name}`, expr: m[1]!, shown: [], valuesOf: m[2]! });
    }
    for (const p of panelsOf(dashboard)) {
      for (const t of p.targets ?? []) {
        const shown = [...(t.legendFormat ?? "").matchAll(/\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}/g)].map((m) => m[1]!);
        all.push({ where: `${file} panel "${p.title}" ${t.refId}`, expr: t.expr ?? "", shown });
      }
    }
  }
  for (const r of rules) {
    const text = [...Object.values(r.labels ?? {}), ...Object.values(r.annotations ?? {})].join("\n");
    const shown = [...text.matchAll(/\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)/g)].map((m) => m[1]!);
    all.push({ where: `rule ${r.alert ?? r.record}`, expr: r.expr, shown });
  }
  return all;
}

/** Each dashboard expression as a recording rule, for promtool to parse: `$__rate_interval` and the like become durations, variables in matchers `.*`. */
function dashboardRules(): object {
  const durations: Record<string, string> = { $__rate_interval: "5m", $__interval: "1m", $__range: "3h" };
  const rulesOf = uses()
    .filter((u) => !u.where.startsWith("rule "))
    .map((u, i) => ({
      record: `dashboard:expr_${i}`,
      expr: u.expr.replace(/\$(?:\{[^}]+\}|[a-zA-Z0-9_]+)/g, (v) => durations[v] ?? ".*"),
    }));
  return { groups: [{ name: "dashboards", rules: rulesOf }] };
}

function promtoolInstalled(): boolean {
  return spawnSync("promtool", ["--version"], { stdio: "ignore" }).status === 0;
}

describe("observability: dashboards and alert rules", function () {
  this.timeout(20_000);
  let server: InProcessServer;
  let catalog: Catalog;
  let enums: Enumerations;

  before(async () => {
    server = await startServer({
      modules: [...builtinModules, routerModule],
      config: {
        // Module router and a NATS source register their metrics at start,
        // whether or not what they connect to answers (here nothing does).
        router: { relays: ["127.0.0.1:1"] },
        relay: { pools: [{ name: "default", nats: { servers: ["127.0.0.1:1"], subject: "mmgate.observability.test" } }] },
      },
    });
    catalog = await catalogOf(server.host.metrics.registry);
    const services = protoServices();
    enums = {
      services,
      served: new Set([...server.host.serviceNames, "unknown"]),
      codes: new Set([codeName(0), ...Object.values(Code).filter((c): c is Code => typeof c === "number").map((c) => codeName(c))]),
    };
  });
  after(() => server?.close());

  it("reads the registry of a server running every module", () => {
    for (const name of ["grpc_server_handled_total", "mmgate_media_admission_rejected_total", "mmgate_images_circuit_state", "encode_hop_lifecycle", "kv_dc_relay_subscribers", "mmgate_router_pool_ready", "mmgate_relay_nats_messages_total"]) {
      expect(catalog.has(name), name).to.equal(true);
    }
    expect([...catalog.get("grpc_server_handling_seconds_bucket")!.labels]).to.include.members(["grpc_service", "grpc_method", "grpc_type", "grpc_code", "le"]);
    expect(catalog.has("grpc_server_handling_seconds"), "a histogram is only its _bucket, _sum and _count series").to.equal(false);
  });

  it("knows which metrics are registered lazily, and where", async () => {
    const atStart = new Set((await server.host.metrics.registry.getMetricsAsJSON()).map((m) => m.name));
    for (const lazy of LAZY) {
      expect(atStart.has(lazy.name), `${lazy.name} is registered at start now: drop it from LAZY`).to.equal(false);
      const source = readFileSync(join(repoRoot, lazy.file), "utf8");
      expect(source, `${lazy.file} registers ${lazy.name} (${lazy.when})`).to.include(`"${lazy.name}"`);
      for (const label of lazy.labels) expect(source, `${lazy.file} gives ${lazy.name} the label ${label}`).to.include(`"${label}"`);
    }
  });

  it("has one dashboard per area, in Grafana's dashboard model", () => {
    expect(dashboards.map((d) => d.file)).to.have.members(AREAS.map((a) => `mmgate-${a}.json`));
    const uids = new Set<string>();
    for (const { file, dashboard: d } of dashboards) {
      expect(uids.has(d.uid), `${file}: uid ${d.uid} is unique`).to.equal(false);
      uids.add(d.uid);
      expect(d.title, file).to.be.a("string").and.not.equal("");
      expect(d.schemaVersion, file).to.be.within(36, 41);
      const vars = new Map(d.templating.list.map((v) => [v.name, v]));
      expect(vars.get("datasource"), `${file}: a datasource variable`).to.include({ type: "datasource", query: "prometheus" });
      for (const name of ["job", "instance"]) {
        expect(vars.get(name)?.type, `${file}: a ${name} variable`).to.equal("query");
        expect(vars.get(name)?.datasource?.uid, `${file}: variable ${name}`).to.equal("${datasource}");
      }
      const ids = new Set<number>();
      for (const p of panelsOf(d)) {
        const where = `${file}: panel "${p.title}"`;
        expect(["row", "timeseries", "stat"], where).to.include(p.type);
        expect(ids.has(p.id), `${where}: id ${p.id} is unique`).to.equal(false);
        ids.add(p.id);
        expect(p.gridPos.x + p.gridPos.w, `${where} fits the 24 columns`).to.be.at.most(24);
        if (p.type === "row") continue;
        expect(p.datasource, where).to.deep.equal({ type: "prometheus", uid: "${datasource}" });
        expect(p.targets, where).to.be.an("array").that.is.not.empty;
        const refIds = p.targets!.map((t) => t.refId);
        expect(new Set(refIds).size, `${where}: refIds are unique`).to.equal(refIds.length);
        for (const t of p.targets!) {
          expect(t.datasource, where).to.deep.equal({ type: "prometheus", uid: "${datasource}" });
          expect(t.expr, where).to.be.a("string").and.not.equal("");
        }
      }
      // Every variable an expression uses is defined (or one of Grafana's own).
      for (const p of panelsOf(d)) {
        for (const t of p.targets ?? []) {
          for (const v of analyze(t.expr ?? "").variables) {
            const name = v.replace(/^\$\{?/, "").replace(/\}$/, "");
            expect(name.startsWith("__") || vars.has(name), `${file}: panel "${p.title}" uses ${v}, which is not defined`).to.equal(true);
          }
        }
      }
    }
  });

  it("has the alert rules the issue asks for, with severities, durations and instructions", () => {
    const names = rules.map((r) => r.alert);
    expect(names).to.include.members([
      "MmgateImagesBreakerOpen",
      "MmgateEncodeFallbackRateHigh",
      "MmgateRelaySubscribersLagging",
      "MmgateRelayPublicationFailures",
      "MmgateMediaAdmissionRejections",
      "MmgateDrainStuck",
    ]);
    expect(new Set(names).size, "alert names are unique").to.equal(names.length);
    for (const r of rules) {
      expect(r.alert, "only alerting rules").to.be.a("string");
      expect(["warning", "critical"], `${r.alert}: severity`).to.include(r.labels?.["severity"]);
      if (r.for !== undefined) expect(r.for, `${r.alert}: for`).to.match(/^\d+[smh]$/);
      expect(r.annotations?.["summary"], `${r.alert}: summary`).to.be.a("string").and.not.equal("");
      expect(r.annotations?.["description"]?.length ?? 0, `${r.alert}: a description that says what to do`).to.be.above(80);
    }
  });

  it("uses only registered metrics and labels, in every panel, variable and rule", () => {
    const failures: string[] = [];
    for (const use of uses()) {
      let a: Analysis;
      try {
        a = analyze(use.expr);
      } catch (err) {
        failures.push(`${use.where}: ${(err as Error).message}`);
        continue;
      }
      const found = problems(a, catalog, enums);
      const out = outputLabels(a, catalog);
      for (const l of use.shown) if (!out.has(l)) found.push(`shows {{${l}}} / $labels.${l}, which the result does not carry (it has ${[...out].sort().join(", ")})`);
      if (use.valuesOf !== undefined && !out.has(use.valuesOf)) found.push(`label_values of ${use.valuesOf}, which the metric does not have`);
      failures.push(...found.map((f) => `${use.where}: ${f}\n      ${use.expr.replace(/\s+/g, " ")}`));
    }
    expect(failures, failures.join("\n")).to.deep.equal([]);
  });

  it("catches a metric or label the code does not register (the checker itself)", () => {
    const check = (expr: string) => problems(analyze(expr), catalog, enums);
    expect(check('sum by (grpc_code) (rate(grpc_server_handled_total{job=~"$job"}[5m]))')).to.deep.equal([]);
    expect(check("rate(grpc_server_handled[5m])")).to.deep.equal(["grpc_server_handled is not registered"]);
    expect(check("rate(grpc_server_handling_seconds[5m])")).to.deep.equal(["grpc_server_handling_seconds is not registered"]);
    expect(check('encode_members{status="admitted"}')).to.deep.equal(["encode_members has no label status"]);
    expect(check('encode_members{state="admited"}')[0]).to.match(/no such value/);
    expect(check('grpc_server_handled_total{grpc_service="mmgate.media.v1.MediaService", grpc_method="Decod"}')[0]).to.match(/no such value/);
    expect(check("sum by (reason) (rate(encode_fallbacks_total[5m]))")[0]).to.match(/groups by reason/);
    expect(check("rate(mmgate_media_tensor_store_bytes[5m])")[0]).to.match(/rate\(\) of mmgate_media_tensor_store_bytes, a gauge/);
    expect(check("histogram_quantile(0.9, sum by (le) (rate(grpc_server_handling_seconds_sum[5m])))").join("\n")).to.match(/not a _bucket series/);
    expect(check("histogram_quantile(0.9, sum by (le) (rate(grpc_server_handling_seconds_bucket[5m])))")).to.deep.equal([]);
    expect(() => analyze("sum by (x) (frobnicate(up))")).to.throw(/unknown function frobnicate/);
    expect([...outputLabels(analyze("sum by (stage) (rate(mmgate_media_admission_rejected_total[5m])) > 0"), catalog)]).to.deep.equal(["stage"]);
    expect([...outputLabels(analyze("encode_hop_lifecycle == 1"), catalog)]).to.include.members(["state", "job", "instance"]);
  });

  it("passes promtool check rules, and each alert fires in its scenario and only there", function () {
    if (!promtoolInstalled()) {
      if (process.env["CI"]) throw new Error("promtool is not installed (CI installs the Debian package prometheus: scripts/ensure-tools.mjs)");
      console.warn("    promtool is not on PATH: skipping (apt-get install prometheus to run it)");
      this.skip();
    }
    const check = spawnSync("promtool", ["check", "rules", rulesPath], { encoding: "utf8" });
    expect(check.status, `${check.stdout}${check.stderr}`).to.equal(0);
    const dir = mkdtempSync(join(tmpdir(), "mmgate-alerts-"));
    try {
      // The dashboards' PromQL too, as recording rules, with Grafana's variables filled in.
      const recorded = join(dir, "dashboards.yaml");
      writeFileSync(recorded, stringifyYaml(dashboardRules()));
      const parsed = spawnSync("promtool", ["check", "rules", recorded], { encoding: "utf8" });
      expect(parsed.status, `the dashboards' PromQL:\n${parsed.stdout}${parsed.stderr}`).to.equal(0);
      const file = join(dir, "alerts.test.yaml");
      writeFileSync(file, stringifyYaml(promtoolTests()));
      const unit = spawnSync("promtool", ["test", "rules", file], { encoding: "utf8" });
      expect(unit.status, `${unit.stdout}${unit.stderr}`).to.equal(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// ---------------------------------------------------------------- alert scenarios

const TARGET = { job: "mmgate", instance: "a:9464" };
const T = 'job="mmgate", instance="a:9464"';

interface Scenario {
  readonly name: string;
  /** Series and their values in promtool's notation, one sample a minute. */
  readonly series: readonly (readonly [string, string])[];
  readonly at: string;
  /** Per alert, the label sets expected to fire beyond job and instance (none: the alert must not fire). */
  readonly alerts: Readonly<Record<string, readonly Record<string, string>[]>>;
}

const SCENARIOS: readonly Scenario[] = [
  {
    name: "one provider's breaker has not closed for 5 minutes",
    series: [
      [`mmgate_images_circuit_state{${T}, provider="p1", state="closed"}`, "0x15"],
      [`mmgate_images_circuit_state{${T}, provider="p2", state="closed"}`, "1x15"],
    ],
    at: "10m",
    alerts: { MmgateImagesBreakerOpen: [{ provider: "p1" }], MmgateImagesAllBreakersOpen: [] },
  },
  {
    name: "a breaker that closed again within 5 minutes",
    series: [[`mmgate_images_circuit_state{${T}, provider="p1", state="closed"}`, "0 0 0 1 1 1 0 0 0 1 1 1"]],
    at: "10m",
    alerts: { MmgateImagesBreakerOpen: [] },
  },
  {
    name: "every provider's breaker open",
    series: [
      [`mmgate_images_circuit_state{${T}, provider="p1", state="closed"}`, "0x15"],
      [`mmgate_images_circuit_state{${T}, provider="p2", state="closed"}`, "0x15"],
    ],
    at: "10m",
    alerts: { MmgateImagesAllBreakersOpen: [{}], MmgateImagesBreakerOpen: [{ provider: "p1" }, { provider: "p2" }] },
  },
  {
    name: "the shared idempotency store unreachable for 10 minutes",
    series: [[`mmgate_images_idempotency_store_degraded{${T}}`, "0x2 1x15"]],
    at: "12m",
    alerts: { MmgateImagesIdempotencyStoreDegraded: [{}] },
  },
  {
    name: "the shared idempotency store back within 5 minutes",
    series: [[`mmgate_images_idempotency_store_degraded{${T}}`, "0x2 1x3 0x10"]],
    at: "12m",
    alerts: { MmgateImagesIdempotencyStoreDegraded: [] },
  },
  {
    name: "20% of encode attempts fall back",
    series: [
      [`encode_attempts_total{${T}}`, "0+60x40"],
      [`encode_fallbacks_total{${T}, cause="timeout"}`, "0+12x40"],
    ],
    at: "30m",
    alerts: { MmgateEncodeFallbackRateHigh: [{}] },
  },
  {
    name: "2% of encode attempts fall back",
    series: [
      [`encode_attempts_total{${T}}`, "0+60x40"],
      [`encode_fallbacks_total{${T}, cause="timeout"}`, "0+1.2x40"],
    ],
    at: "30m",
    alerts: { MmgateEncodeFallbackRateHigh: [] },
  },
  {
    name: "fallbacks among too few attempts to tell",
    series: [
      [`encode_attempts_total{${T}}`, "0+1x40"],
      [`encode_fallbacks_total{${T}, cause="timeout"}`, "0+1x40"],
    ],
    at: "30m",
    alerts: { MmgateEncodeFallbackRateHigh: [] },
  },
  {
    name: "the hop has no worker admitted",
    series: [
      [`encode_hop_lifecycle{${T}, state="unavailable"}`, "1x15"],
      [`encode_hop_lifecycle{${T}, state="active"}`, "0x15"],
    ],
    at: "10m",
    alerts: { MmgateEncodeHopUnavailable: [{}] },
  },
  {
    name: "a pool stream ends lagged every minute",
    series: [[`kv_dc_relay_subscriber_lagged_total{${T}, stream="pool"}`, "0+1x40"]],
    at: "30m",
    alerts: { MmgateRelaySubscribersLagging: [{ stream: "pool" }] },
  },
  {
    name: "one lagged stream",
    series: [[`kv_dc_relay_subscriber_lagged_total{${T}, stream="pool"}`, "0x10 1x30"]],
    at: "30m",
    alerts: { MmgateRelaySubscribersLagging: [] },
  },
  {
    name: "one terminal publication failure",
    series: [[`kv_dc_relay_terminal_publication_failures_total{${T}}`, "0x5 1x10"]],
    at: "8m",
    alerts: { MmgateRelayPublicationFailures: [{}], MmgateRelayPublicationFailuresRepeated: [] },
  },
  {
    name: "terminal publication failures one after another",
    series: [[`kv_dc_relay_terminal_publication_failures_total{${T}}`, "0x5 1 2 3 4x10"]],
    at: "15m",
    alerts: { MmgateRelayPublicationFailures: [{}], MmgateRelayPublicationFailuresRepeated: [{}] },
  },
  {
    name: "media refuses a decode a second",
    series: [[`mmgate_media_admission_rejected_total{${T}, stage="decode"}`, "0+60x40"], [`mmgate_media_admission_rejected_total{${T}, stage="fetch"}`, "0x40"]],
    at: "30m",
    alerts: { MmgateMediaAdmissionRejections: [{ stage: "decode" }] },
  },
  {
    name: "the relay refuses pool streams at a limit",
    series: [[`kv_dc_relay_subscriber_limit_rejected_total{${T}, stream="pool", scope="per_pool"}`, "0+10x40"]],
    at: "30m",
    alerts: { MmgateRelaySubscriberLimitRejections: [{ stream: "pool", scope: "per_pool" }] },
  },
  {
    name: "a drain a minute past its bound (delay and grace: 11 s)",
    series: [
      [`mmgate_draining{${T}}`, "0x4 1x30"],
      [`mmgate_drain_started_timestamp_seconds{${T}}`, "0x4 300x30"],
      [`mmgate_shutdown_grace_seconds{${T}}`, "11x35"],
    ],
    at: "20m",
    alerts: { MmgateDrainStuck: [{}] },
  },
  {
    name: "a drain within its bound (10 min)",
    series: [
      [`mmgate_draining{${T}}`, "0x4 1x30"],
      [`mmgate_drain_started_timestamp_seconds{${T}}`, "0x4 300x30"],
      [`mmgate_shutdown_grace_seconds{${T}}`, "600x35"],
    ],
    at: "12m",
    alerts: { MmgateDrainStuck: [] },
  },
  {
    name: "a server certificate three days from its end",
    series: [
      [`mmgate_tls_certificate_expiry_timestamp_seconds{${T}, role="server", file="/tls/tls.crt"}`, `${3 * 86_400}x30`],
      [`mmgate_tls_certificate_expiry_timestamp_seconds{${T}, role="client", file="/tls/client.crt"}`, `${60 * 86_400}x30`],
    ],
    at: "20m",
    alerts: { MmgateTlsCertificateExpiringSoon: [{ role: "server", file: "/tls/tls.crt" }] },
  },
  {
    name: "a reload that failed and nothing since",
    series: [
      [`mmgate_tls_reload_total{${T}, role="server", result="error"}`, "0x5 1x30"],
      [`mmgate_tls_reload_total{${T}, role="server", result="success"}`, "0x35"],
    ],
    at: "15m",
    alerts: { MmgateTlsReloadFailing: [{ role: "server" }] },
  },
  {
    name: "half a rotation refused, then the whole one taken",
    series: [
      [`mmgate_tls_reload_total{${T}, role="server", result="error"}`, "0x5 1x30"],
      [`mmgate_tls_reload_total{${T}, role="server", result="success"}`, "0x5 1x30"],
    ],
    at: "15m",
    alerts: { MmgateTlsReloadFailing: [] },
  },
  {
    name: "a server that is not draining",
    series: [
      [`mmgate_draining{${T}}`, "0x35"],
      [`mmgate_drain_started_timestamp_seconds{${T}}`, "0x35"],
      [`mmgate_shutdown_grace_seconds{${T}}`, "11x35"],
    ],
    at: "20m",
    alerts: { MmgateDrainStuck: [] },
  },
];

/** `{{ $labels.name }}` of a rule's annotation, filled in as Prometheus would. */
function expand(template: string, labels: Record<string, string>): string {
  const text = template.replace(/\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}/g, (_, name: string) => labels[name] ?? "");
  if (text.includes("{{")) throw new Error(`a template this test does not expand: ${template}`);
  return text;
}

/** promtool's unit test file: the scenarios, with the annotations each firing alert must carry. */
function promtoolTests(): object {
  return {
    rule_files: [rulesPath],
    evaluation_interval: "1m",
    tests: SCENARIOS.map((s) => ({
      name: s.name,
      interval: "1m",
      input_series: s.series.map(([series, values]) => ({ series, values })),
      alert_rule_test: Object.entries(s.alerts).map(([alertname, firing]) => {
        const rule = rules.find((r) => r.alert === alertname);
        if (!rule) throw new Error(`scenario "${s.name}": no rule ${alertname}`);
        return {
          eval_time: s.at,
          alertname,
          exp_alerts: firing.map((extra) => {
            const labels = { ...TARGET, ...extra };
            return {
              exp_labels: { ...labels, ...rule.labels },
              exp_annotations: Object.fromEntries(Object.entries(rule.annotations ?? {}).map(([k, v]) => [k, expand(v, labels)])),
            };
          }),
        };
      }),
    })),
  };
}
