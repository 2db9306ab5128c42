/**
 * The KV relay: its catalog (WatchKvPoolCatalog) and, per pool, the
 * decoded filter stream (SubscribeKvPoolDecoded, sparse snapshot chunks then
 * deltas): live sequence, deltas per second and the filter's occupancy as a
 * heat map, updating as events arrive.
 */
import { toJsonString } from "@bufbuild/protobuf";
import { KvEventRelay, ProducerIdentitySchema, WorkerRole, type KvPoolDescriptor } from "../../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { DecodedRelayService } from "../../../../gen/mmgate/kvrelay/v1/cbi1_pb.js";
import { append, facts, h, notice, replace } from "../dom.js";
import { Lane, drawHeatmap } from "../heatmap.js";
import { client, describeError, isCancel, sleep, streamBudget } from "../rpc.js";
import type { View, ViewContext } from "../view.js";

/** RELAY_CONTRACT_MARKER ("KVR1"), field 127 of every relay request. */
const CONTRACT_MARKER = 0x4b565231;
/** The window deltas per second are counted over. */
const RATE_WINDOW_MS = 5000;
const RETRY_MS = 3000;

function subscriberId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(6));
  return `mmgate-console-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

function poolTitle(pool: KvPoolDescriptor): string {
  const e = pool.servingEndpoint;
  const models = pool.registrations.map((r) => r.canonicalModelId).join(", ");
  return `${e ? `${e.namespace}.${e.component}.${e.endpoint}` : "pool"}${models ? ` · ${models}` : ""}`;
}

/** One pool's card: its stream, its mirror of the filter and what is shown of it. */
class PoolMonitor {
  readonly el: HTMLElement;
  private readonly controller = new AbortController();
  private readonly sequence = h("span", { "data-field": "sequence" }, "—");
  private readonly state = h("span", { "data-field": "state" }, "connecting");
  private readonly rate = h("span", { "data-field": "rate" }, "0");
  private readonly occupancy = h("span", { "data-field": "occupied" }, "0");
  private readonly streams = h("span", { "data-field": "subscribers" }, "—");
  private readonly canvas: HTMLCanvasElement;
  private readonly error = h("div", { class: "pool-error" });
  private lane: Lane | undefined;
  private readonly deltaTimes: number[] = [];
  private deltas = 0;
  private dirty = false;

  constructor(
    readonly key: string,
    private readonly pool: KvPoolDescriptor,
    index: number,
    parent: AbortSignal,
  ) {
    const f = pool.producer?.ckfFormat;
    const buckets = Number(f?.bucketCount ?? 0n);
    this.canvas = h("canvas", { class: "heatmap", role: "img", "aria-label": "bucket occupancy: no data yet", width: 256, height: 1 });
    const title = poolTitle(pool);
    this.el = h(
      "article",
      { class: "pool", "data-pool": index, "aria-label": `pool ${title}` },
      h("h3", {}, title),
      facts([
        ["live sequence", this.sequence],
        ["stream", this.state],
        ["deltas / s", this.rate],
        ["occupied slots", this.occupancy],
        ["relay pool streams", this.streams],
        ["dc id", String(pool.producer?.poolId?.dcId ?? "—")],
        ["filter", `${buckets.toLocaleString("en")} buckets · seed 0x${(f?.seed ?? 0n).toString(16)} · layout ${pool.producer?.layoutGeneration ?? "—"}`],
        ["roles", pool.poolRoles.map((r) => (WorkerRole[r] ?? String(r)).toLowerCase()).join(", ") || "—"],
      ]),
      h("figure", { class: "heat" }, this.canvas, h("figcaption", {}, "Bucket occupancy: each cell a run of buckets, brighter with more slots in use")),
      this.error,
    );
    if (buckets > 0 && buckets <= 1 << 24) this.lane = new Lane(buckets);
    parent.addEventListener("abort", () => this.controller.abort(), { once: true });
  }

  stop(): void {
    this.controller.abort();
  }

  showStreams(text: string): void {
    replace(this.streams, text);
  }

  /** Follows the pool until stopped, reopening after a failure (a restart, a lag, a new producer). */
  async follow(): Promise<void> {
    const relay = client(DecodedRelayService);
    const signal = this.controller.signal;
    while (!signal.aborted) {
      try {
        replace(this.state, "loading snapshot");
        const stream = relay.subscribeKvPoolDecoded(
          { request: { subscriberId: subscriberId(), contractMarker: CONTRACT_MARKER, expectedProducer: this.pool.producer }, sparse: true },
          { signal },
        );
        for await (const update of stream) {
          replace(this.error);
          replace(this.sequence, String(update.sequence));
          this.el.dataset["sequence"] = String(update.sequence);
          const body = update.frame?.body;
          if (body?.case === "snapshotChunk") {
            const chunk = body.value;
            if (chunk.chunkIndex === 0) this.lane?.reset();
            if (chunk.sparse) for (const image of chunk.nonzero) this.lane?.set(image.bucket, image.value);
            else chunk.words.forEach((word, i) => this.lane?.set(Number(chunk.bucketOffset) + i, word));
            replace(this.state, chunk.chunkIndex + 1 >= chunk.chunkCount ? "live" : `snapshot ${chunk.chunkIndex + 1} of ${chunk.chunkCount}`);
          } else if (body?.case === "delta") {
            for (const image of body.value.images) this.lane?.set(image.bucket, image.value);
            this.deltas += 1;
            this.deltaTimes.push(performance.now());
            replace(this.state, "live");
          }
          this.schedule();
        }
        replace(this.state, "ended by the server; reopening");
      } catch (err) {
        if (isCancel(err, signal)) return;
        replace(this.state, "failed; reopening");
        replace(this.error, notice("error", describeError(err).text));
      }
      await sleep(RETRY_MS, signal);
    }
  }

  /** Redraws at most once a frame, however fast updates come. */
  private schedule(): void {
    if (this.dirty) return;
    this.dirty = true;
    requestAnimationFrame(() => {
      this.dirty = false;
      this.render();
    });
  }

  render(): void {
    const now = performance.now();
    while (this.deltaTimes.length > 0 && this.deltaTimes[0]! < now - RATE_WINDOW_MS) this.deltaTimes.shift();
    replace(this.rate, `${(this.deltaTimes.length / (RATE_WINDOW_MS / 1000)).toFixed(1)} (${this.deltas} since opened)`);
    const lane = this.lane;
    if (lane === undefined) return;
    const capacity = lane.bucketCount * 4;
    replace(this.occupancy, `${lane.occupiedSlots.toLocaleString("en")} of ${capacity.toLocaleString("en")} (${lane.nonEmptyBuckets.toLocaleString("en")} buckets)`);
    this.el.dataset["occupied"] = String(lane.occupiedSlots);
    drawHeatmap(this.canvas, lane);
    this.canvas.setAttribute("aria-label", `bucket occupancy: ${lane.occupiedSlots} of ${capacity} slots in use, in ${lane.nonEmptyBuckets} buckets`);
  }
}

function mount(root: HTMLElement, ctx: ViewContext): void {
  const relay = client(KvEventRelay);
  const catalogInfo = h("p", { class: "status", role: "status", "aria-live": "polite" }, "Reading the catalog…");
  const streamsInfo = h("p", { class: "hint" });
  const poolsEl = h("div", { class: "pools" });
  append(root, catalogInfo, streamsInfo, poolsEl);
  // The catalog's stream is one of the budget.
  const followable = Math.max(1, streamBudget() - 1);
  const monitors = new Map<string, PoolMonitor>();
  let streamsText = "—";

  const sync = (pools: readonly KvPoolDescriptor[]) => {
    const wanted = pools.map((pool) => ({ pool, key: pool.producer ? toJsonString(ProducerIdentitySchema, pool.producer) : "" }));
    for (const [key, monitor] of monitors) {
      if (!wanted.some((w) => w.key === key)) {
        monitor.stop();
        monitor.el.remove();
        monitors.delete(key);
      }
    }
    const elements: HTMLElement[] = [];
    wanted.forEach(({ pool, key }, index) => {
      let monitor = monitors.get(key);
      if (monitor === undefined && index < followable) {
        monitor = new PoolMonitor(key, pool, index, ctx.signal);
        monitors.set(key, monitor);
        monitor.showStreams(streamsText);
        void monitor.follow();
      }
      elements.push(monitor?.el ?? h("article", { class: "pool" }, h("h3", {}, poolTitle(pool)), notice("info", `Not followed: this page keeps to ${followable} pool streams over HTTP/1.1 (serve over TLS for HTTP/2).`)));
    });
    replace(poolsEl, ...elements);
  };

  // The relay's open streams, read from the server's metrics: its contract has no per-pool subscriber count.
  void (async () => {
    while (!ctx.signal.aborted) {
      try {
        const res = await fetch("api/relay-streams", { signal: ctx.signal, cache: "no-store" });
        const body = (await res.json()) as { streams: Record<string, number> | null };
        const s = body.streams;
        streamsText = s === null ? "not known" : `${s["pool"] ?? 0} (all pools, this page's included)`;
        replace(streamsInfo, s === null ? "" : `Open relay streams: ${Object.entries(s).map(([kind, n]) => `${kind} ${n}`).join(" · ")}`);
        for (const monitor of monitors.values()) monitor.showStreams(streamsText);
      } catch {
        // Left as it was; the next reading may work.
      }
      await sleep(2000, ctx.signal);
    }
  })();

  void (async () => {
    while (!ctx.signal.aborted) {
      try {
        for await (const update of relay.watchKvPoolCatalog({ subscriberId: subscriberId(), contractMarker: CONTRACT_MARKER }, { signal: ctx.signal })) {
          const pools = update.snapshot?.pools ?? [];
          replace(catalogInfo, `Catalog revision ${update.revision}: ${pools.length} pool${pools.length === 1 ? "" : "s"} · relay incarnation 0x${(update.relay?.relayIncarnation ?? 0n).toString(16)}`);
          root.dataset["state"] = "ready";
          root.dataset["pools"] = String(pools.length);
          sync(pools);
        }
      } catch (err) {
        if (isCancel(err, ctx.signal)) return;
        replace(catalogInfo, notice("error", `catalog: ${describeError(err).text}; reopening`));
      }
      await sleep(RETRY_MS, ctx.signal);
    }
  })();

  // Deltas per second decay with no traffic too.
  const tick = setInterval(() => {
    for (const monitor of monitors.values()) monitor.render();
  }, 1000);
  ctx.signal.addEventListener("abort", () => clearInterval(tick), { once: true });
}

export const relayView: View = { id: "relay", title: "Relay", services: [KvEventRelay, DecodedRelayService], module: "relay", mount };
