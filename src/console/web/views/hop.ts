/**
 * The encode hop: EncodeHopService.GetStatus every two seconds while the
 * view is open: its lifecycle, target, members with their request counts,
 * and the requests that fell back to inline encoding, by cause.
 */
import { EncodeHopService, Lifecycle, MemberState, type GetStatusResponse } from "../../../../gen/mmgate/encode/v1/encode_pb.js";
import { append, facts, h, notice, replace, table } from "../dom.js";
import { client, describeError, isCancel, sleep } from "../rpc.js";
import type { View, ViewContext } from "../view.js";

const POLL_MS = 2000;

function render(status: GetStatusResponse): HTMLElement[] {
  const lifecycle = (Lifecycle[status.lifecycle] ?? String(status.lifecycle)).toLowerCase();
  const fallbacks = Object.entries(status.fallbacks).sort(([a], [b]) => a.localeCompare(b));
  const now = Date.now();
  return [
    facts([
      ["lifecycle", h("strong", { "data-field": "lifecycle", class: `lifecycle ${lifecycle}` }, lifecycle)],
      ["target", status.targetId || "none"],
      ["generation", String(status.generation)],
      ["encoded", String(status.encoded)],
      ["passed through", String(status.passthrough)],
    ]),
    status.members.length === 0
      ? notice("info", "No Encode workers in the pool.")
      : table(
          "Members",
          ["id", "address", "state", "requests", "failures", "why not admitted"],
          status.members.map((m) => {
            const until = Number(m.ejectedUntilUnixMs);
            const state = (MemberState[m.state] ?? String(m.state)).toLowerCase();
            return [
              m.id,
              m.address,
              until > now ? `${state} (${Math.ceil((until - now) / 1000)} s more)` : state,
              String(m.requests),
              String(m.failures),
              m.reason || "—",
            ];
          }),
        ),
    fallbacks.length === 0
      ? notice("info", "No request fell back to inline encoding.")
      : table("Fallbacks by cause", ["cause", "requests"], fallbacks.map(([cause, n]) => [cause, String(n)])),
  ];
}

function mount(root: HTMLElement, ctx: ViewContext): void {
  const hop = client(EncodeHopService);
  const body = h("div", { "aria-live": "polite" }, "Reading the hop's status…");
  const updated = h("p", { class: "hint" });
  append(root, body, updated);
  void (async () => {
    while (!ctx.signal.aborted) {
      try {
        const status = await hop.getStatus({}, { signal: ctx.signal });
        replace(body, ...render(status));
        replace(updated, `Updated ${new Date().toLocaleTimeString()} · every ${POLL_MS / 1000} s`);
        root.dataset["state"] = "ready";
      } catch (err) {
        if (isCancel(err, ctx.signal)) return;
        replace(body, notice("error", describeError(err).text));
      }
      await sleep(POLL_MS, ctx.signal);
    }
  })();
}

export const hopView: View = { id: "hop", title: "Hop", services: [EncodeHopService], module: "encodeHop", mount };
