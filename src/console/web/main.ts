/**
 * The console's shell: the key form, the navigation between views (the
 * URL's hash, so the browser's back button and links work), and the
 * server's identity. Each view is mounted into <main> when its link is
 * followed and stopped (its streams cancelled) when another one is.
 */
import "./console.css";
import { Health } from "../../../gen/grpc/health/v1/health_pb.js";
import { AdminService } from "../../../gen/mmgate/admin/v1/admin_pb.js";
import { append, h, notice, replace } from "./dom.js";
import { client, describeError, key } from "./rpc.js";
import type { View } from "./view.js";
import { healthView } from "./views/health.js";
import { hopView } from "./views/hop.js";
import { imagesView } from "./views/images.js";
import { mediaView } from "./views/media.js";
import { relayView } from "./views/relay.js";

const VIEWS: readonly View[] = [imagesView, mediaView, relayView, hopView, healthView];

const main = document.getElementById("view") as HTMLElement;
const nav = document.getElementById("views") as HTMLElement;
const serverLine = document.getElementById("server") as HTMLElement;
const keyForm = document.getElementById("key-form") as HTMLFormElement;
const keyInput = document.getElementById("key") as HTMLInputElement;
const keyStatus = document.getElementById("key-status") as HTMLElement;

let served: ReadonlySet<string> | undefined;
let current: AbortController | undefined;

for (const view of VIEWS) append(nav, h("a", { href: `#/${view.id}`, "data-view": view.id }, view.title));

function viewOf(hash: string): View {
  const id = hash.replace(/^#\/?/, "");
  return VIEWS.find((v) => v.id === id) ?? VIEWS[0]!;
}

function show(): void {
  current?.abort();
  const controller = new AbortController();
  current = controller;
  const view = viewOf(location.hash);
  for (const link of nav.querySelectorAll("a")) {
    if (link.dataset["view"] === view.id) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${view.title} · mmgate console`;
  const root = h("section", { class: "view", "aria-labelledby": `${view.id}-title`, "data-view": view.id });
  append(root, h("h2", { id: `${view.id}-title`, tabindex: -1 }, view.title));
  replace(main, root);
  const missing = served === undefined ? undefined : view.services.find((s) => !served!.has(s.typeName));
  if (missing !== undefined && view.services.every((s) => !served!.has(s.typeName))) {
    append(
      root,
      notice(
        "info",
        `${missing.typeName} is not running in this process: the ${view.module} module is off here (its config's modules list, or this role's). `,
        "Open the console of the process that runs it.",
      ),
    );
    root.dataset["state"] = "not-served";
    return;
  }
  view.mount(root, { signal: controller.signal, served });
}

keyInput.value = key.get();
keyStatus.textContent = key.get() === "" ? "No key: public methods only." : "Key kept for this tab.";
keyForm.addEventListener("submit", (event) => {
  event.preventDefault();
  key.set(keyInput.value.trim());
  keyStatus.textContent = keyInput.value.trim() === "" ? "Key forgotten." : "Key kept for this tab.";
});
document.getElementById("key-forget")!.addEventListener("click", () => {
  keyInput.value = "";
  key.set("");
  keyStatus.textContent = "Key forgotten.";
});

window.addEventListener("hashchange", () => {
  show();
  // Keyboard and screen-reader users land on the new view's heading.
  (main.querySelector("h2") as HTMLElement | null)?.focus();
});

async function identify(): Promise<void> {
  try {
    const list = await client(Health).list({});
    served = new Set(Object.keys(list.statuses));
  } catch {
    // Older servers have no List: every view tries its calls and shows what comes back.
    served = undefined;
  }
  try {
    const status = await client(AdminService).getStatus({});
    replace(serverLine, `mmgate ${status.version} · up ${Math.round(status.uptimeSeconds)} s${status.draining ? " · draining" : ""}`);
  } catch (err) {
    replace(serverLine, notice("error", `server status: ${describeError(err).text}`));
  }
}

void identify().then(() => {
  show();
  document.body.dataset["ready"] = "true";
});
