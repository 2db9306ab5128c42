/**
 * A few DOM helpers instead of a framework: the views are forms, tables and
 * canvases that change in place as messages arrive, which plain DOM does
 * directly. Text always goes in as text nodes (never HTML), so nothing a
 * server sends can become markup or script.
 */

type Attrs = Record<string, string | number | boolean | undefined | ((event: Event) => void)>;
type Child = Node | string | number | false | null | undefined;

/** An element with attributes ("on…" keys become listeners; false and undefined are left out) and children. */
export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === false) continue;
    if (typeof value === "function") el.addEventListener(key.slice(2).toLowerCase(), value);
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
  append(el, ...children);
  return el;
}

export function append(parent: Node, ...children: Child[]): void {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    parent.appendChild(typeof child === "string" || typeof child === "number" ? document.createTextNode(String(child)) : child);
  }
}

/** Replaces an element's children. */
export function replace(parent: Element, ...children: Child[]): void {
  parent.replaceChildren();
  append(parent, ...children);
}

let ids = 0;
/** A fresh id, to tie a label to its control. */
export function uid(prefix: string): string {
  ids += 1;
  return `${prefix}-${ids}`;
}

/** A labelled control: the label names it for assistive technology and a click on it focuses it. */
export function field(label: string, control: HTMLElement, hint?: string): HTMLElement {
  control.id ||= uid("f");
  const hintEl = hint === undefined ? undefined : h("small", { id: `${control.id}-hint`, class: "hint" }, hint);
  if (hintEl) control.setAttribute("aria-describedby", hintEl.id);
  return h("div", { class: "field" }, h("label", { for: control.id }, label), control, hintEl);
}

/** A two-column list of names and values. */
export function facts(rows: readonly (readonly [string, Child])[]): HTMLDListElement {
  const dl = h("dl", { class: "facts" });
  for (const [name, value] of rows) append(dl, h("dt", {}, name), h("dd", {}, value ?? "—"));
  return dl;
}

/** A table with a header row; cells are text or nodes. */
export function table(caption: string, head: readonly string[], rows: readonly (readonly Child[])[]): HTMLTableElement {
  return h(
    "table",
    {},
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, ...head.map((name) => h("th", { scope: "col" }, name)))),
    h("tbody", {}, ...rows.map((row) => h("tr", {}, ...row.map((cell) => h("td", {}, cell))))),
  );
}

export function formatBytes(n: number | bigint): string {
  const v = Number(n);
  if (v < 1024) return `${v} B`;
  if (v < 1024 * 1024) return `${(v / 1024).toFixed(1)} KiB`;
  if (v < 1024 ** 3) return `${(v / 1024 / 1024).toFixed(1)} MiB`;
  return `${(v / 1024 ** 3).toFixed(2)} GiB`;
}

export function formatMs(ms: number | bigint): string {
  const v = Number(ms);
  return v < 1000 ? `${Math.round(v)} ms` : `${(v / 1000).toFixed(2)} s`;
}

/** A notice in the view: role=status for news, role=alert for failures, so screen readers announce them. */
export function notice(kind: "info" | "error" | "warn", ...children: Child[]): HTMLElement {
  return h("p", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status" }, ...children);
}
