/**
 * Health: every entry grpc.health.v1 knows (the server's "", each service,
 * sub-entries such as a provider's circuit), each followed with
 * Health/Watch. Over HTTP/1.1 one stream takes one of the browser's six
 * connections to the server, so there the page watches the server's overall
 * entry and reads the list again on each change and every few seconds.
 */
import { Health, HealthCheckResponse_ServingStatus as Status } from "../../../../gen/grpc/health/v1/health_pb.js";
import { append, h, notice, replace } from "../dom.js";
import { client, describeError, isCancel, sleep, streamBudget } from "../rpc.js";
import type { View, ViewContext } from "../view.js";

const LIST_EVERY_MS = 3000;
const RETRY_MS = 3000;

function statusName(status: Status): string {
  return Status[status] ?? String(status);
}

function mount(root: HTMLElement, ctx: ViewContext): void {
  const health = client(Health);
  const mode = h("p", { class: "hint" });
  const problem = h("div");
  const body = h("tbody");
  append(
    root,
    mode,
    problem,
    h(
      "table",
      { class: "health" },
      h("caption", {}, "Serving status of each entry"),
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "entry"), h("th", { scope: "col" }, "status"), h("th", { scope: "col" }, "changed"))),
      body,
    ),
  );
  const rows = new Map<string, { status: HTMLElement; changed: HTMLElement; last?: Status }>();

  const row = (name: string) => {
    let r = rows.get(name);
    if (r === undefined) {
      r = { status: h("td", { "data-field": "status" }, "…"), changed: h("td", {}, "—") };
      rows.set(name, r);
      const tr = h("tr", { "data-entry": name }, h("th", { scope: "row" }, name === "" ? "server (overall)" : name), r.status, r.changed);
      // Kept in name order, the overall entry first.
      const after = [...body.children].find((el) => ((el as HTMLElement).dataset["entry"] ?? "") > name);
      body.insertBefore(tr, after ?? null);
    }
    return r;
  };
  const show = (name: string, status: Status) => {
    const r = row(name);
    if (r.last === status) return;
    const label = statusName(status);
    replace(r.status, h("span", { class: `badge ${label.toLowerCase()}` }, label));
    if (r.last !== undefined) replace(r.changed, new Date().toLocaleTimeString());
    r.last = status;
  };

  const list = async () => {
    const res = await health.list({}, { signal: ctx.signal });
    for (const [name, entry] of Object.entries(res.statuses)) show(name, entry.status);
    root.dataset["state"] = "ready";
    return Object.keys(res.statuses);
  };

  const watch = async (name: string, onChange?: () => void) => {
    while (!ctx.signal.aborted) {
      try {
        for await (const res of health.watch({ service: name }, { signal: ctx.signal })) {
          show(name, res.status);
          onChange?.();
        }
      } catch (err) {
        if (isCancel(err, ctx.signal)) return;
        replace(problem, notice("error", `watch ${name || "(server)"}: ${describeError(err).text}; watching again`));
      }
      await sleep(RETRY_MS, ctx.signal);
    }
  };

  void (async () => {
    let names: string[];
    try {
      names = await list();
    } catch (err) {
      if (!isCancel(err, ctx.signal)) replace(problem, notice("error", describeError(err).text));
      return;
    }
    if (names.length <= streamBudget() - 1) {
      replace(mode, `Following Health/Watch for each of ${names.length} entries.`);
      for (const name of names) void watch(name);
      return;
    }
    replace(mode, `Over HTTP/1.1 a browser holds six connections to a server and each Watch keeps one: following Watch for the server's overall status and reading the ${names.length} entries with Health/List on each change and every ${LIST_EVERY_MS / 1000} s. Served over TLS (HTTP/2), the console watches each entry.`);
    void watch("", () => void list().catch(() => undefined));
    while (!ctx.signal.aborted) {
      await sleep(LIST_EVERY_MS, ctx.signal);
      if (ctx.signal.aborted) break;
      try {
        await list();
        replace(problem);
      } catch (err) {
        if (!isCancel(err, ctx.signal)) replace(problem, notice("error", describeError(err).text));
      }
    }
  })();
}

export const healthView: View = { id: "health", title: "Health", services: [Health], module: "host", mount };
