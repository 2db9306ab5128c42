/**
 * Decoded media: a dropped (or chosen) image or video goes to
 * MediaService.Decode as bytes; the page shows what the server made of it
 * (shape, dtype, content hash, the transfer descriptor) and draws the
 * tensor it stored, read back with ReadTensor, then releases it.
 */
import { DataType, MediaService, type DecodeResponse } from "../../../../gen/mmgate/media/v1/media_pb.js";
import { append, facts, field, formatBytes, h, notice, replace } from "../dom.js";
import { indentJson } from "../json-text.js";
import { client, describeError, isCancel } from "../rpc.js";
import type { View, ViewContext } from "../view.js";

/** Tensors above this are described but not drawn: reading them back would cost more than a thumbnail is worth. */
const MAX_DRAWN_BYTES = 48 * 1024 * 1024;
/** Frames of a video drawn at most. */
const MAX_FRAMES_DRAWN = 12;

/** One H×W×C uint8 image (C 1 to 4) drawn on a canvas of its size; CSS scales it down. */
function drawImage(pixels: Uint8Array, height: number, width: number, channels: number, label: string): HTMLCanvasElement {
  const canvas = h("canvas", { width, height, role: "img", "aria-label": label, class: "thumb" });
  const g = canvas.getContext("2d");
  if (g === null) return canvas;
  const rgba = new ImageData(width, height);
  const d = rgba.data;
  for (let p = 0, q = 0; p < width * height; p += 1, q += channels) {
    const o = p * 4;
    if (channels >= 3) {
      d[o] = pixels[q]!;
      d[o + 1] = pixels[q + 1]!;
      d[o + 2] = pixels[q + 2]!;
      d[o + 3] = channels === 4 ? pixels[q + 3]! : 255;
    } else {
      d[o] = d[o + 1] = d[o + 2] = pixels[q]!;
      d[o + 3] = channels === 2 ? pixels[q + 1]! : 255;
    }
  }
  g.putImageData(rgba, 0, 0);
  return canvas;
}

function describe(res: DecodeResponse, file: File): HTMLElement {
  const info = res.tensorInfo;
  const shape = info?.shape.map(String) ?? [];
  const rows: [string, string | HTMLElement][] = [
    ["file", `${file.name} · ${formatBytes(file.size)}`],
    ["shape", `[${shape.join(", ")}]`],
    // UNSPECIFIED reads as UINT8, the only type.
    ["dtype", info === undefined || info.dtype === DataType.UNSPECIFIED ? "UINT8" : (DataType[info.dtype] ?? String(info.dtype))],
    ["content hash", h("code", { "data-field": "content-hash" }, res.contentHashKey || "(none: empty payload)")],
    ["decoded size", formatBytes(res.sizeBytes)],
    ["store handle", res.handle === 0n ? "not stored" : String(res.handle)],
  ];
  const meta = info?.metadata;
  if (meta?.case === "image") {
    rows.push(["format", `${meta.value.format || "unknown"} · ${meta.value.colorType} · ${meta.value.layout}`]);
  } else if (meta?.case === "video") {
    const v = meta.value;
    rows.push(["source", `${v.sourceFps.toFixed(3)} fps · ${v.sourceDuration.toFixed(2)} s${v.sourceTotalFrames !== undefined ? ` · ${v.sourceTotalFrames} frames` : ""}`]);
    rows.push(["frames picked", (v.framesIndices?.values ?? []).map(String).join(", ") || "none"]);
    rows.push(["at seconds", v.sampledTimestamps.map((t) => t.toFixed(2)).join(", ")]);
  }
  return facts(rows);
}

function mount(root: HTMLElement, ctx: ViewContext): void {
  const media = client(MediaService);
  const input = h("input", { type: "file", accept: "image/*,video/*", name: "file" });
  const frames = h("input", { type: "number", min: 1, max: 256, name: "numFrames", inputmode: "numeric", placeholder: "all" });
  const drop = h(
    "div",
    { class: "drop", tabindex: 0, role: "button", "aria-label": "Drop an image or a video here, or press Enter to choose a file" },
    h("strong", {}, "Drop an image or a video here"),
    h("span", {}, "PNG, JPEG, WebP, GIF, TIFF, AVIF, BMP · MP4, MOV, MKV, WebM (videos need ffmpeg on the server)"),
  );
  const status = h("div", { class: "status", role: "status", "aria-live": "polite" });
  const result = h("div", { class: "media-result" });
  append(
    root,
    h("div", { class: "controls" }, drop, h("div", { class: "row" }, field("Image or video file", input), field("Video frames to sample", frames, "evenly spread; empty: every frame"))),
    status,
    result,
  );
  root.dataset["state"] = "ready";

  drop.addEventListener("click", () => input.click());
  drop.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      input.click();
    }
  });
  drop.addEventListener("dragover", (event) => {
    event.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    const file = event.dataTransfer?.files[0];
    if (file) void decode(file);
  });
  input.addEventListener("change", () => {
    const file = input.files?.[0];
    if (file) void decode(file);
  });

  let busy = false;
  async function decode(file: File): Promise<void> {
    if (busy) return;
    busy = true;
    root.dataset["run"] = "running";
    replace(status, `Decoding ${file.name}…`);
    replace(result);
    const signal = ctx.signal;
    try {
      const data = new Uint8Array(await file.arrayBuffer());
      const numFrames = frames.value === "" ? undefined : BigInt(Math.max(1, Math.floor(Number(frames.value))));
      const started = performance.now();
      const res = await media.decode({ source: { case: "data", value: data }, video: numFrames === undefined ? undefined : { numFrames } }, { signal });
      const ms = performance.now() - started;
      replace(status, `Decoded ${file.name} in ${Math.round(ms)} ms`);
      const pictures = h("div", { class: "thumbs", "aria-label": "Decoded tensor", role: "group" });
      append(result, describe(res, file), pictures);
      if (res.descriptorJson !== "") {
        append(result, h("details", {}, h("summary", {}, "Transfer descriptor (JSON)"), h("pre", { "data-field": "descriptor" }, indentJson(res.descriptorJson))));
      }
      await draw(res, pictures, signal);
    } catch (err) {
      if (!isCancel(err, signal)) replace(status, notice("error", describeError(err).text));
    } finally {
      busy = false;
      root.dataset["run"] = "done";
    }
  }

  /** Reads the stored tensor back and draws it (a video: its sampled frames), then releases it. */
  async function draw(res: DecodeResponse, into: HTMLElement, signal: AbortSignal): Promise<void> {
    if (res.handle === 0n) return;
    const shape = (res.tensorInfo?.shape ?? []).map(Number);
    try {
      if (res.sizeBytes > BigInt(MAX_DRAWN_BYTES)) {
        append(into, notice("info", `Not drawn: ${formatBytes(res.sizeBytes)} is more than a thumbnail needs.`));
        return;
      }
      const pixels = new Uint8Array(Number(res.sizeBytes));
      for await (const chunk of media.readTensor({ handle: res.handle }, { signal })) pixels.set(chunk.data, Number(chunk.offset));
      if (shape.length === 3) {
        const [height, width, channels] = shape as [number, number, number];
        append(into, h("figure", {}, drawImage(pixels, height, width, channels, `decoded image ${width}×${height}`), h("figcaption", {}, "decoded tensor")));
      } else if (shape.length === 4) {
        const [count, height, width, channels] = shape as [number, number, number, number];
        const video = res.tensorInfo?.metadata.case === "video" ? res.tensorInfo.metadata.value : undefined;
        const frameBytes = height * width * channels;
        const step = Math.max(1, Math.ceil(count / MAX_FRAMES_DRAWN));
        for (let t = 0; t < count; t += step) {
          const index = video?.framesIndices?.values[t];
          const at = video?.sampledTimestamps[t];
          const label = `frame ${index ?? t}${at !== undefined ? ` at ${at.toFixed(2)} s` : ""}`;
          append(into, h("figure", {}, drawImage(pixels.subarray(t * frameBytes, (t + 1) * frameBytes), height, width, channels, label), h("figcaption", {}, label)));
        }
      }
    } catch (err) {
      if (!isCancel(err, signal)) append(into, notice("error", `reading the tensor: ${describeError(err).text}`));
    } finally {
      // The receiver owns the release; without the key (when the server has one) the store's TTL frees it.
      await media.releaseTensor({ handle: res.handle }).catch((err: unknown) => {
        append(into, notice("info", `Not released (${describeError(err).text}); the store drops it when its TTL passes.`));
      });
    }
  }
}

export const mediaView: View = { id: "media", title: "Media", services: [MediaService], module: "media", mount };
