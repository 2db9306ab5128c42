/**
 * The images playground: one GenerateStream call for n images, a grid that
 * fills with each output's partial images as they arrive (every event
 * carries its output index) and then the finals, failures in the cell they
 * belong to, and what the response says about the call.
 */
import { toJsonString } from "@bufbuild/protobuf";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { ConnectError } from "@connectrpc/connect";
import type { GetCapabilitiesResponse, ListProvidersResponse } from "../../../../gen/mmgate/images/v1/image_service_pb.js";
import { ImageService } from "../../../../gen/mmgate/images/v1/image_service_pb.js";
import {
  ErrorCode,
  ErrorDetailSchema,
  FailurePolicy,
  OutputFormat,
  Quality,
  ResponseFormat,
  type ErrorDetail,
  type ImageResponse,
} from "../../../../gen/mmgate/images/v1/images_pb.js";
import { append, facts, field, formatBytes, formatMs, h, notice, replace, table } from "../dom.js";
import { client, describeError, isCancel } from "../rpc.js";
import type { View, ViewContext } from "../view.js";

const QUALITY_NAMES: readonly [Quality, string][] = [
  [Quality.AUTO, "auto"],
  [Quality.LOW, "low"],
  [Quality.MEDIUM, "medium"],
  [Quality.HIGH, "high"],
];

const SIZE_PRESETS: readonly [number, number][] = [
  [256, 256],
  [512, 512],
  [768, 768],
  [1024, 1024],
  [1024, 768],
  [768, 1024],
  [1536, 1024],
];

/** The MIME type of encoded image bytes, from their signature. */
function mimeOf(bytes: Uint8Array): string {
  if (bytes[0] === 0x89 && bytes[1] === 0x50) return "image/png";
  if (bytes[0] === 0xff && bytes[1] === 0xd8) return "image/jpeg";
  if (bytes[0] === 0x52 && bytes[8] === 0x57) return "image/webp";
  return "application/octet-stream";
}

const EXTENSIONS: Partial<Record<OutputFormat, string>> = { [OutputFormat.PNG]: "png", [OutputFormat.JPEG]: "jpg", [OutputFormat.WEBP]: "webp" };

/** A key unique to one click: secure contexts only have randomUUID, and the console may be served over plain HTTP. */
function idempotencyKey(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return `console-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

function valueText(value: Value | undefined): string {
  return value === undefined ? "—" : toJsonString(ValueSchema, value);
}

function errorCodeName(code: ErrorCode): string {
  return (ErrorCode[code] ?? "UNSPECIFIED").toLowerCase();
}

function detailText(detail: ErrorDetail | undefined): string {
  if (detail === undefined) return "failed";
  return `${errorCodeName(detail.code)}: ${detail.message}${detail.retryable ? " (retryable)" : ""}`;
}

/** One output's place in the grid. */
class Cell {
  readonly el: HTMLElement;
  private readonly img: HTMLImageElement;
  private readonly caption: HTMLElement;
  private readonly links: HTMLElement;
  private url: string | undefined;
  partials = 0;

  constructor(readonly index: number) {
    this.img = h("img", { alt: `output ${index}: waiting`, width: 256, height: 256 });
    this.caption = h("figcaption", {}, `#${index} waiting`);
    this.links = h("div", { class: "links" });
    this.el = h("figure", { class: "cell", role: "listitem", "data-index": index, "data-state": "waiting", "data-partials": 0 }, this.img, this.caption, this.links);
  }

  private state(state: string, caption: string): void {
    this.el.dataset["state"] = state;
    replace(this.caption, caption);
  }

  private show(bytes: Uint8Array, alt: string): string {
    if (this.url !== undefined) URL.revokeObjectURL(this.url);
    this.url = URL.createObjectURL(new Blob([bytes.slice()], { type: mimeOf(bytes) }));
    this.img.src = this.url;
    this.img.alt = alt;
    return this.url;
  }

  progress(stage: string): void {
    if (this.el.dataset["state"] === "waiting") this.state("working", `#${this.index} ${stage}`);
  }

  partial(partialIndex: number, bytes: Uint8Array, of: number): void {
    this.partials += 1;
    this.el.dataset["partials"] = String(this.partials);
    // When the first preview and the final were shown (page clock, ms), for whoever checks their order.
    this.el.dataset["partialAt"] ??= String(Math.round(performance.now()));
    this.show(bytes, `output ${this.index}: partial image ${partialIndex + 1}`);
    this.state("partial", `#${this.index} partial ${partialIndex + 1}${of > 0 ? ` of ${of}` : ""}`);
  }

  final(bytes: Uint8Array, info: { width: number; height: number; byteSize: bigint; sha256: string; format: OutputFormat; ms?: bigint | undefined }): void {
    const url = this.show(bytes, `output ${this.index}: final image, ${info.width}×${info.height}`);
    this.el.dataset["finalAt"] = String(Math.round(performance.now()));
    this.state("final", `#${this.index} ${info.width}×${info.height} · ${formatBytes(info.byteSize)}${info.ms !== undefined ? ` · ${formatMs(info.ms)}` : ""}`);
    const name = `image-${this.index}.${EXTENSIONS[info.format] ?? "bin"}`;
    replace(
      this.links,
      h("a", { href: url, download: name, class: "download", "aria-label": `Download ${name}` }, "Download"),
      h("code", { class: "sha", title: `sha256 ${info.sha256}` }, info.sha256.slice(0, 12)),
    );
  }

  fail(text: string): void {
    if (this.el.dataset["state"] === "final") return;
    this.state("failed", `#${this.index} ${text}`);
    this.img.alt = `output ${this.index}: failed`;
  }

  release(): void {
    if (this.url !== undefined) URL.revokeObjectURL(this.url);
  }
}

function responseFacts(response: ImageResponse, key: string, clientTimes: Record<string, number>): HTMLElement {
  const t = response.timings;
  const u = response.usage;
  const rows: [string, string][] = [
    ["request id", response.id],
    ["provider / model", `${response.provider} / ${response.model}`],
    ["idempotency key sent", key],
    ["images", `${response.data.length} of ${response.data.length + response.failures.length}`],
  ];
  if (u !== undefined) {
    rows.push(["usage", `input ${u.inputTokens ?? "—"} · output ${u.outputTokens ?? "—"} · total ${u.totalTokens ?? "—"} tokens`]);
  }
  if (t !== undefined) {
    rows.push(["server timings", `queue ${formatMs(t.queueMs)} · input ${formatMs(t.inputMs)} · provider ${formatMs(t.providerMs)} · artifacts ${formatMs(t.artifactMs)} · total ${formatMs(t.totalMs)}`]);
  }
  rows.push([
    "seen here",
    Object.entries(clientTimes)
      .map(([name, ms]) => `${name} ${formatMs(ms)}`)
      .join(" · "),
  ]);
  return facts(rows);
}

function mount(root: HTMLElement, ctx: ViewContext): void {
  const images = client(ImageService);
  const providerSelect = h("select", { name: "provider" });
  const modelSelect = h("select", { name: "model" });
  const prompt = h("textarea", { name: "prompt", rows: 3, required: true, maxlength: 4000 });
  prompt.value = "a red fox in the snow, watercolour";
  const count = h("input", { name: "n", type: "number", min: 1, max: 16, value: 4, required: true, inputmode: "numeric" });
  const size = h("select", { name: "size" }, h("option", { value: "auto" }, "auto"));
  const quality = h("select", { name: "quality" }, ...QUALITY_NAMES.map(([q, name]) => h("option", { value: q }, name)));
  const partials = h("input", { name: "partialImages", type: "number", min: 0, max: 3, value: 2, inputmode: "numeric" });
  const policyName = "policy";
  const failFast = h("input", { type: "radio", name: policyName, value: "fail-fast", id: "policy-fail-fast", checked: true });
  const bestEffort = h("input", { type: "radio", name: policyName, value: "best-effort", id: "policy-best-effort" });
  const policy = h(
    "fieldset",
    { class: "policy" },
    h("legend", {}, "When an image fails"),
    h("label", { for: failFast.id }, failFast, " fail fast (stop the rest)"),
    h("label", { for: bestEffort.id }, bestEffort, " best effort (keep the rest)"),
  );
  const generate = h("button", { type: "submit", class: "primary" }, "Generate");
  const cancel = h("button", { type: "button", disabled: true }, "Cancel");
  const form = h(
    "form",
    { class: "controls", "aria-label": "Image request" },
    field("Prompt", prompt),
    h("div", { class: "row" }, field("Provider", providerSelect), field("Model", modelSelect)),
    h(
      "div",
      { class: "row" },
      field("Images (n)", count),
      field("Size", size),
      field("Quality", quality),
      field("Partial images", partials, "previews per image while it renders"),
    ),
    policy,
    h("div", { class: "actions" }, generate, cancel),
  );
  const status = h("p", { class: "status", role: "status", "aria-live": "polite" });
  const grid = h("div", { class: "grid", "aria-label": "Generated images", role: "list" });
  const summary = h("div", { class: "summary" });
  append(root, form, status, grid, summary);

  let providers: ListProvidersResponse | undefined;
  let cells: Cell[] = [];
  let run: AbortController | undefined;
  ctx.signal.addEventListener("abort", () => {
    run?.abort();
    for (const cell of cells) cell.release();
  });

  const fillModels = () => {
    const provider = providers?.providers.find((p) => p.name === providerSelect.value);
    replace(modelSelect, h("option", { value: "" }, "provider's default"), ...(provider?.models ?? []).map((m) => h("option", { value: m }, m)));
  };
  const applyCapabilities = (caps: GetCapabilitiesResponse["capabilities"]) => {
    if (caps === undefined) return;
    if (caps.count) count.max = String(caps.count.max);
    if (caps.partialImages) partials.max = String(caps.partialImages.max);
    const sizes = [...(caps.sizes?.allowed ?? [])];
    // A provider that takes any size gets a few square and wide presets within its edge limits.
    if (caps.sizes?.arbitrary && sizes.length === 0) {
      const min = caps.sizes.minEdge ?? 1;
      const max = caps.sizes.maxEdge ?? 4096;
      for (const [width, height] of SIZE_PRESETS) if (Math.min(width, height) >= min && Math.max(width, height) <= max) sizes.push(`${width}x${height}`);
    }
    const chosen = size.value;
    replace(size, h("option", { value: "auto" }, "auto"), ...sizes.map((s) => h("option", { value: s }, s)));
    if (sizes.includes(chosen)) size.value = chosen;
    if (caps.qualities.length > 0) {
      const q = quality.value;
      replace(quality, ...QUALITY_NAMES.filter(([value]) => caps.qualities.includes(value)).map(([value, name]) => h("option", { value }, name)));
      if ([...quality.options].some((o) => o.value === q)) quality.value = q;
    }
  };
  const loadCapabilities = async () => {
    try {
      const res = await images.getCapabilities({ provider: providerSelect.value, model: modelSelect.value }, { signal: ctx.signal });
      applyCapabilities(res.capabilities);
    } catch (err) {
      if (!isCancel(err, ctx.signal)) replace(status, notice("error", `capabilities: ${describeError(err).text}`));
    }
  };
  providerSelect.addEventListener("change", () => {
    fillModels();
    void loadCapabilities();
  });
  modelSelect.addEventListener("change", () => void loadCapabilities());

  void (async () => {
    try {
      providers = await images.listProviders({}, { signal: ctx.signal });
      replace(
        providerSelect,
        ...providers.providers.map((p) =>
          h("option", { value: p.name }, `${p.displayName || p.name}${p.default ? " (default)" : ""}${p.circuitState && p.circuitState !== "closed" ? ` · circuit ${p.circuitState}` : ""}`),
        ),
      );
      providerSelect.value = providers.defaultProvider || (providers.providers[0]?.name ?? "");
      fillModels();
      await loadCapabilities();
      root.dataset["state"] = "ready";
    } catch (err) {
      if (!isCancel(err, ctx.signal)) replace(status, notice("error", `providers: ${describeError(err).text}`));
    }
  })();

  cancel.addEventListener("click", () => run?.abort());
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (run !== undefined) return;
    void generateImages();
  });

  async function generateImages(): Promise<void> {
    const n = Number(count.value);
    const key = idempotencyKey();
    const controller = new AbortController();
    run = controller;
    const signal = AbortSignal.any([controller.signal, ctx.signal]);
    for (const cell of cells) cell.release();
    cells = Array.from({ length: n }, (_, i) => new Cell(i));
    replace(grid, ...cells.map((c) => c.el));
    replace(summary);
    replace(status, `Sending ${n} image request${n === 1 ? "" : "s"} · idempotency key ${key}`);
    root.dataset["run"] = "running";
    generate.disabled = true;
    cancel.disabled = false;
    const t0 = performance.now();
    const times: Record<string, number> = {};
    const partialCount = Number(partials.value);
    try {
      const stream = images.generateStream(
        {
          request: {
            prompt: prompt.value,
            parameters: {
              n,
              size: size.value,
              quality: Number(quality.value) as Quality,
              partialImages: partialCount,
              failurePolicy: bestEffort.checked ? FailurePolicy.BEST_EFFORT : FailurePolicy.FAIL_FAST,
            },
            routing: { provider: providerSelect.value, model: modelSelect.value },
            idempotencyKey: key,
            responseFormat: ResponseFormat.BYTES,
          },
        },
        { signal },
      );
      for await (const message of stream) {
        const event = message.event;
        switch (event.case) {
          case "started":
            times["started"] ??= performance.now() - t0;
            replace(status, `Started ${event.value.id} · ${event.value.outputs} outputs · idempotency key ${key}`);
            break;
          case "progress":
            cells[event.value.index]?.progress(event.value.stage);
            break;
          case "partialImage":
            times["first partial"] ??= performance.now() - t0;
            cells[event.value.index]?.partial(event.value.partialIndex, event.value.image, partialCount);
            break;
          case "completed": {
            times["completed"] = performance.now() - t0;
            const response = event.value.response;
            if (response !== undefined) finish(response, key, times);
            break;
          }
          default:
            break;
        }
      }
    } catch (err) {
      if (isCancel(err, signal)) {
        for (const cell of cells) cell.fail("cancelled");
        replace(status, `Cancelled · idempotency key ${key}`);
      } else {
        const error = describeError(err);
        const detail = ConnectError.from(err).findDetails(ErrorDetailSchema)[0];
        // The detail names the output that failed first; the others were stopped, unless every one failed.
        const index = detail?.details?.["output_index"];
        const allFailed = detail?.details?.["all_outputs_failed"] === true;
        for (const cell of cells) {
          cell.fail(!allFailed && typeof index === "number" && index !== cell.index ? "stopped (fail-fast)" : detail ? detailText(detail) : error.text);
        }
        replace(status, notice("error", error.text), h("small", {}, ` idempotency key ${key}`));
      }
    } finally {
      root.dataset["run"] = "done";
      generate.disabled = false;
      cancel.disabled = true;
      run = undefined;
    }
  }

  function finish(response: ImageResponse, key: string, times: Record<string, number>): void {
    for (const image of response.data) {
      if (image.payload.case !== "image") continue;
      cells[image.index]?.final(image.payload.value, {
        width: image.width,
        height: image.height,
        byteSize: image.byteSize,
        sha256: image.sha256,
        format: image.format,
        ms: image.generationMs,
      });
    }
    for (const failure of response.failures) cells[failure.index]?.fail(detailText(failure.error));
    replace(status, `Done: ${response.data.length} image${response.data.length === 1 ? "" : "s"}${response.failures.length > 0 ? `, ${response.failures.length} failed` : ""}`);
    const extra: HTMLElement[] = [];
    if (response.warnings.length > 0) extra.push(notice("warn", `Warnings: ${response.warnings.join("; ")}`));
    if (response.normalizations.length > 0) {
      extra.push(
        table(
          "Normalizations",
          ["field", "requested", "effective", "reason"],
          response.normalizations.map((n) => [n.field, valueText(n.requested), valueText(n.effective), n.reason]),
        ),
      );
    }
    replace(summary, responseFacts(response, key, times), ...extra);
  }
}

export const imagesView: View = { id: "images", title: "Images", services: [ImageService], module: "images", mount };
