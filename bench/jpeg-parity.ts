/**
 * JPEG decoder parity: how far the pixels that mmgate's decoder (sharp, i.e.
 * libvips with its bundled mozjpeg/libjpeg-turbo) produces for a JPEG are from
 * those of other decoders, and so whether the canonical content hash (XXH3
 * over shape + pixels, spec F.4) of the same file agrees between a mmgate
 * deployment and the reference (whose JPEG backend is libjpeg-turbo by default,
 * else the Rust `image` crate, spec F.2).
 *
 * A set of JPEGs is generated here (gradients + noise, and flat colour
 * blocks; baseline and progressive; chroma 4:4:4, 4:2:2, 4:2:0, plus 4:4:0,
 * 4:1:1 and grey; restart markers; q75 and q95; sizes from 16x16 to 1023x767,
 * odd ones included) and each is decoded by:
 * - sharp, exactly as the server does (`decodeImage` from src/media);
 * - Pillow (libjpeg-turbo, the system's), run once with Debian's python;
 * - djpeg from libjpeg-turbo-progs: `-dct int` (the default, with fancy
 *   upsampling), `-dct int -nosmooth` (fancy upsampling off), `-dct fast`,
 *   `-dct float`;
 * - optional npm decoders, when resolvable: `@julusian/image-rs` (a native
 *   build of the Rust `image` crate 0.25, whose JPEG decoder is zune-jpeg:
 *   the reference's non-libjpeg path), `@silvia-odwyer/photon-node` (a WASM
 *   build of `image` 0.24, whose JPEG decoder is jpeg-decoder) and `jpeg-js`
 *   (pure JS). They are not project dependencies: install them anywhere with
 *   `npm install --prefix DIR @julusian/image-rs @silvia-odwyer/photon-node jpeg-js`
 *   and set JPEG_PARITY_PREFIX=DIR (or have them in the project's node_modules).
 *
 * Each cell compares one decoder's output with sharp's: `✓` identical bytes
 * (hash equal), else `<share of differing bytes>/<max abs difference> ✗`
 * (hash differs). The last column compares the reference's own two JPEG
 * paths, image-rs (zune-jpeg) against djpeg -dct int (libjpeg-turbo defaults).
 *
 * The encoders: sharp for what it exposes (4:4:4 and 4:2:0, baseline or
 * progressive, grey); cjpeg (libjpeg-turbo-progs) for 4:2:2, 4:4:0, 4:1:1 and
 * restart intervals, which sharp does not expose (without cjpeg, 4:2:2 comes
 * from Pillow and the others are skipped). Labels are read back from each
 * file's SOF and DRI markers, not taken from the settings.
 *
 * Needs Pillow (Debian: `apt-get install python3-pil`); without it the script
 * says so and exits 0, so `npm run bench` skips it. djpeg/cjpeg columns and
 * cases are left out when libjpeg-turbo-progs is missing. PYTHON picks the
 * interpreter (default: the first of /usr/bin/python3, python3 with PIL).
 * Runs in a few seconds.
 * Run: node --import tsx bench/jpeg-parity.ts
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import sharp from "sharp";
import { canonicalContentHash, decodeImage, DEFAULT_MAX_ALLOC } from "../src/media/index.js";

interface Raw {
  readonly width: number;
  readonly height: number;
  /** Channels of `data`: 1 (grey) or 3 (RGB). */
  readonly channels: number;
  readonly data: Uint8Array;
}

// ---------------------------------------------------------------- tools

function findPillowPython(): string | null {
  const candidates = process.env.PYTHON ? [process.env.PYTHON] : ["/usr/bin/python3", "python3"];
  for (const py of candidates) {
    const res = spawnSync(py, ["-c", "import PIL.JpegImagePlugin"], { encoding: "utf8" });
    if (res.status === 0) return py;
  }
  return null;
}

function hasTool(name: string): boolean {
  return spawnSync(name, ["-version"], { encoding: "utf8" }).error === undefined;
}

/** An optional npm module: from the project's node_modules, else from JPEG_PARITY_PREFIX. */
async function optionalModule(name: string): Promise<Record<string, unknown> | null> {
  try {
    return (await import(name)) as Record<string, unknown>;
  } catch {
    // fall through to the prefix
  }
  const prefix = process.env.JPEG_PARITY_PREFIX;
  if (!prefix) return null;
  try {
    const resolved = createRequire(join(prefix, "package.json")).resolve(name);
    return (await import(pathToFileURL(resolved).href)) as Record<string, unknown>;
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------- content

/** xorshift32, so every run makes the same images. */
function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s / 0x1_0000_0000;
  };
}

const clamp = (v: number) => (v < 0 ? 0 : v > 255 ? 255 : Math.round(v));

/** Photographic-like: smooth gradients, a soft disc with an edge, and noise. */
function photo(width: number, height: number, seed: number): Uint8Array {
  const rand = rng(seed);
  const out = new Uint8Array(width * height * 3);
  const cx = width * 0.6;
  const cy = height * 0.4;
  const r = Math.min(width, height) * 0.3;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const u = x / Math.max(1, width - 1);
      const v = y / Math.max(1, height - 1);
      const inDisc = (x - cx) ** 2 + (y - cy) ** 2 < r * r;
      const noise = () => (rand() + rand() + rand() - 1.5) * 24;
      const i = (y * width + x) * 3;
      out[i] = clamp(40 + 180 * u + 20 * Math.sin(y / 7) + (inDisc ? 50 : 0) + noise());
      out[i + 1] = clamp(30 + 160 * v + 25 * Math.cos(x / 11) + noise());
      out[i + 2] = clamp(200 - 150 * u * v + (inDisc ? -80 : 0) + noise());
    }
  }
  return out;
}

/** Flat: saturated solid blocks with hard edges, no noise. */
function flat(width: number, height: number): Uint8Array {
  const colours = [
    [230, 30, 40],
    [20, 160, 60],
    [30, 60, 220],
    [250, 220, 30],
    [255, 255, 255],
    [20, 20, 20],
  ] as const;
  const out = new Uint8Array(width * height * 3);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const c = colours[(Math.floor((x * 3) / width) + 3 * Math.floor((y * 2) / height)) % colours.length]!;
      out.set(c, (y * width + x) * 3);
    }
  }
  return out;
}

// ---------------------------------------------------------------- encoding

type Sampling = "4:4:4" | "4:2:2" | "4:2:0" | "4:4:0" | "4:1:1" | "grey";

interface CaseSpec {
  readonly content: "photo" | "flat";
  readonly width: number;
  readonly height: number;
  readonly sampling: Sampling;
  readonly progressive: boolean;
  readonly quality: number;
  /** cjpeg's -restart argument: "1" every MCU row, "5B" every 5 MCUs. */
  readonly restart?: string;
}

const CJPEG_SAMPLE: Record<Sampling, string> = {
  "4:4:4": "1x1",
  "4:2:2": "2x1",
  "4:2:0": "2x2",
  "4:4:0": "1x2",
  "4:1:1": "4x1",
  grey: "",
};

interface Tools {
  readonly python: string;
  readonly cjpeg: boolean;
  readonly djpeg: boolean;
  readonly dir: string;
}

function ppm(rgb: Uint8Array, width: number, height: number, grey: boolean): Buffer {
  const header = Buffer.from(`${grey ? "P5" : "P6"}\n${width} ${height}\n255\n`);
  if (!grey) return Buffer.concat([header, rgb]);
  const g = Buffer.alloc(width * height);
  for (let i = 0; i < g.length; i++) g[i] = rgb[i * 3]!;
  return Buffer.concat([header, g]);
}

/** Encodes one case; null when the needed encoder is missing. Returns [bytes, encoder]. */
async function encode(spec: CaseSpec, tools: Tools, index: number): Promise<[Buffer, string] | null> {
  const rgb = spec.content === "photo" ? photo(spec.width, spec.height, index + 1) : flat(spec.width, spec.height);
  const grey = spec.sampling === "grey";
  const bySharp = spec.restart === undefined && (spec.sampling === "4:4:4" || spec.sampling === "4:2:0" || grey);
  if (bySharp) {
    let pipeline = sharp(rgb, { raw: { width: spec.width, height: spec.height, channels: 3 } });
    if (grey) pipeline = pipeline.toColourspace("b-w");
    const chromaSubsampling = spec.sampling === "4:4:4" ? "4:4:4" : "4:2:0";
    const buf = await pipeline.jpeg({ quality: spec.quality, progressive: spec.progressive, chromaSubsampling }).toBuffer();
    return [buf, "sharp"];
  }
  const input = join(tools.dir, `src-${index}.${grey ? "pgm" : "ppm"}`);
  const output = join(tools.dir, `enc-${index}.jpg`);
  writeFileSync(input, ppm(rgb, spec.width, spec.height, grey));
  if (tools.cjpeg) {
    const args = ["-quality", String(spec.quality)];
    if (grey) args.push("-grayscale");
    else args.push("-sample", CJPEG_SAMPLE[spec.sampling]);
    if (spec.progressive) args.push("-progressive");
    if (spec.restart !== undefined) args.push("-restart", spec.restart);
    const res = spawnSync("cjpeg", [...args, "-outfile", output, input]);
    if (res.status !== 0) throw new Error(`cjpeg failed: ${res.stderr.toString()}`);
    return [readFileSync(output), "cjpeg"];
  }
  if (spec.sampling === "4:2:2" && spec.restart === undefined) {
    const script = [
      "import sys; from PIL import Image",
      "im = Image.open(sys.argv[1])",
      "im.save(sys.argv[2], 'JPEG', quality=int(sys.argv[3]), subsampling='4:2:2', progressive=sys.argv[4] == '1')",
    ].join("\n");
    const res = spawnSync(tools.python, ["-c", script, input, output, String(spec.quality), spec.progressive ? "1" : "0"]);
    if (res.status !== 0) throw new Error(`Pillow encode failed: ${res.stderr.toString()}`);
    return [readFileSync(output), "Pillow"];
  }
  return null;
}

/** Frame type, chroma sampling and restart interval as the file declares them. */
function describeJpeg(buf: Uint8Array): string {
  let mode = "?";
  let sampling = "?";
  let restart = 0;
  for (let i = 2; i + 4 <= buf.length; ) {
    if (buf[i] !== 0xff) break;
    const marker = buf[i + 1]!;
    if (marker === 0xda) break; // start of scan: headers are done
    const len = (buf[i + 2]! << 8) | buf[i + 3]!;
    if (marker === 0xc0 || marker === 0xc1 || marker === 0xc2) {
      mode = marker === 0xc2 ? "prog" : "base";
      const comps = buf[i + 9]!;
      const factors: [number, number][] = [];
      for (let c = 0; c < comps; c++) {
        const hv = buf[i + 11 + c * 3]!;
        factors.push([hv >> 4, hv & 15]);
      }
      if (comps === 1) sampling = "grey";
      else {
        const [h, v] = factors[0]!;
        const chromaFull = factors.slice(1).every(([ch, cv]) => ch === 1 && cv === 1);
        const names: Record<string, string> = { "1x1": "4:4:4", "2x1": "4:2:2", "2x2": "4:2:0", "1x2": "4:4:0", "4x1": "4:1:1" };
        sampling = chromaFull ? (names[`${h}x${v}`] ?? `${h}x${v}`) : factors.map(([a, b]) => `${a}x${b}`).join(",");
      }
    } else if (marker === 0xdd) {
      restart = (buf[i + 4]! << 8) | buf[i + 5]!;
    }
    i += 2 + len;
  }
  return `${mode} ${sampling}${restart > 0 ? ` rst${restart}` : ""}`;
}

// ---------------------------------------------------------------- decoders

type Decoder = (file: string, buf: Buffer) => Raw;

/** Parses binary PPM (P6) / PGM (P5) as djpeg writes them. */
function parsePnm(buf: Buffer): Raw {
  const fields: string[] = [];
  let i = 0;
  while (fields.length < 4) {
    while (/\s/.test(String.fromCharCode(buf[i]!))) i++;
    if (buf[i] === 0x23) {
      while (buf[i] !== 0x0a) i++;
      continue;
    }
    let tok = "";
    while (!/\s/.test(String.fromCharCode(buf[i]!))) tok += String.fromCharCode(buf[i++]!);
    fields.push(tok);
  }
  i++; // the single whitespace after maxval
  const [magic, w, h] = fields;
  const channels = magic === "P6" ? 3 : 1;
  const width = Number(w);
  const height = Number(h);
  return { width, height, channels, data: buf.subarray(i, i + width * height * channels) };
}

function djpeg(args: string[]): Decoder {
  return (file) => {
    const res = spawnSync("djpeg", [...args, file], { maxBuffer: 64 * 1024 * 1024 });
    if (res.status !== 0) throw new Error(`djpeg ${args.join(" ")} failed: ${res.stderr.toString()}`);
    return parsePnm(res.stdout);
  };
}

/** RGB(A) output of a decoder that always gives colour, brought to `channels`. */
function fromInterleaved(data: Uint8Array, width: number, height: number, stride: number, channels: number): Raw {
  if (stride === channels) return { width, height, channels, data };
  const out = new Uint8Array(width * height * channels);
  for (let p = 0, j = 0; j < out.length; p += stride) {
    for (let c = 0; c < channels; c++) out[j++] = data[p + c]!;
  }
  return { width, height, channels, data: out };
}

/** Decodes every file with Pillow in one python process. */
function pillowAll(python: string, files: string[], dir: string): Raw[] {
  const script = [
    "import sys, json; from PIL import Image",
    "out = []",
    "for n, f in enumerate(json.load(sys.stdin)):",
    "    im = Image.open(f); im.load()",
    "    if im.mode not in ('L', 'RGB'): im = im.convert('RGB')",
    "    p = f + '.pil'",
    "    open(p, 'wb').write(im.tobytes())",
    "    out.append([p, im.size[0], im.size[1], len(im.getbands())])",
    "print(json.dumps(out))",
  ].join("\n");
  const res = spawnSync(python, ["-c", script], { input: JSON.stringify(files), cwd: dir, encoding: "utf8" });
  if (res.status !== 0) throw new Error(`Pillow decode failed: ${res.stderr}`);
  const rows = JSON.parse(res.stdout) as [string, number, number, number][];
  return rows.map(([p, width, height, channels]) => ({ width, height, channels, data: readFileSync(p) }));
}

// ---------------------------------------------------------------- comparison

interface Diff {
  readonly identical: boolean;
  readonly fraction: number;
  readonly maxAbs: number;
  readonly hashMatch: boolean;
}

function compare(a: Raw, b: Raw): Diff {
  if (a.width !== b.width || a.height !== b.height || a.channels !== b.channels || a.data.length !== b.data.length) {
    throw new Error(`shape mismatch: ${a.width}x${a.height}x${a.channels} vs ${b.width}x${b.height}x${b.channels}`);
  }
  let differing = 0;
  let maxAbs = 0;
  for (let i = 0; i < a.data.length; i++) {
    const d = Math.abs(a.data[i]! - b.data[i]!);
    if (d !== 0) {
      differing++;
      if (d > maxAbs) maxAbs = d;
    }
  }
  const shape = [a.height, a.width, a.channels];
  const hashMatch = canonicalContentHash(shape, "UINT8", a.data) === canonicalContentHash(shape, "UINT8", b.data);
  return { identical: differing === 0, fraction: differing / a.data.length, maxAbs, hashMatch };
}

function cell(d: Diff | undefined): string {
  if (d === undefined) return "–";
  if (d.identical) return d.hashMatch ? "✓" : "✓ (hash ≠!)";
  const pct = d.fraction * 100;
  const share = pct >= 10 ? pct.toFixed(0) : pct >= 0.1 ? pct.toFixed(1) : pct.toFixed(2);
  return `${share}%/${d.maxAbs} ${d.hashMatch ? "(hash =!)" : "✗"}`;
}

// ---------------------------------------------------------------- cases

function cases(): CaseSpec[] {
  const list: CaseSpec[] = [];
  for (const content of ["photo", "flat"] as const) {
    for (const sampling of ["4:4:4", "4:2:2", "4:2:0"] as const) {
      for (const progressive of [false, true]) {
        for (const quality of [75, 95]) list.push({ content, width: 257, height: 193, sampling, progressive, quality });
      }
    }
  }
  for (const [width, height] of [
    [16, 16],
    [63, 47],
    [640, 480],
    [1023, 767],
  ] as const) {
    list.push({ content: "photo", width, height, sampling: "4:2:0", progressive: false, quality: 75 });
  }
  list.push({ content: "photo", width: 1023, height: 767, sampling: "4:4:4", progressive: false, quality: 95 });
  list.push({ content: "photo", width: 1023, height: 767, sampling: "4:2:0", progressive: true, quality: 95 });
  list.push({ content: "photo", width: 257, height: 193, sampling: "4:2:0", progressive: false, quality: 75, restart: "1" });
  list.push({ content: "photo", width: 257, height: 193, sampling: "4:4:4", progressive: false, quality: 95, restart: "5B" });
  list.push({ content: "photo", width: 257, height: 193, sampling: "4:2:2", progressive: false, quality: 75, restart: "2" });
  list.push({ content: "photo", width: 257, height: 193, sampling: "4:2:0", progressive: true, quality: 75, restart: "1" });
  list.push({ content: "photo", width: 257, height: 193, sampling: "4:4:0", progressive: false, quality: 75 });
  list.push({ content: "photo", width: 257, height: 193, sampling: "4:1:1", progressive: false, quality: 75 });
  list.push({ content: "photo", width: 257, height: 193, sampling: "grey", progressive: false, quality: 75 });
  list.push({ content: "photo", width: 257, height: 193, sampling: "grey", progressive: true, quality: 95 });
  return list;
}

// ---------------------------------------------------------------- main

async function main(): Promise<void> {
  const python = findPillowPython();
  if (python === null) {
    console.log("jpeg-parity: skipped, Pillow is not available (Debian: apt-get install python3-pil; or set PYTHON)");
    return;
  }
  const started = performance.now();
  const dir = mkdtempSync(join(tmpdir(), "jpeg-parity-"));
  try {
    const tools: Tools = { python, cjpeg: hasTool("cjpeg"), djpeg: hasTool("djpeg"), dir };
    const pilScript =
      "import PIL, PIL.features as f; print(PIL.__version__, " +
      "'libjpeg-turbo ' + f.version('libjpeg_turbo') if f.check('libjpeg_turbo') else 'libjpeg ' + str(f.version('jpg')))";
    const pil = spawnSync(python, ["-c", pilScript], { encoding: "utf8" });
    const [pilVersion, ...pilJpeg] = pil.stdout.trim().split(" ");
    console.log(
      `jpeg-parity — node ${process.version}, sharp ${sharp.versions.sharp} (libvips ${sharp.versions.vips}, mozjpeg ${sharp.versions.mozjpeg ?? "?"}), ` +
        `Pillow ${pilVersion} (${pilJpeg.join(" ")}) via ${python}`,
    );

    const decoders: [string, Decoder][] = [];
    if (tools.djpeg) {
      const version = spawnSync("djpeg", ["-version"], { encoding: "utf8" }).stderr.trim();
      console.log(`djpeg: ${version}`);
      decoders.push(
        ["djpeg int", djpeg(["-dct", "int"])],
        ["djpeg int nosmooth", djpeg(["-dct", "int", "-nosmooth"])],
        ["djpeg fast", djpeg(["-dct", "fast"])],
        ["djpeg float", djpeg(["-dct", "float"])],
      );
    } else {
      console.log("djpeg: not found (Debian: apt-get install libjpeg-turbo-progs); its columns are left out");
    }
    if (!tools.cjpeg) console.log("cjpeg: not found; 4:2:2 is encoded by Pillow, restart/4:4:0/4:1:1 cases are skipped");

    const imageRs = await optionalModule("@julusian/image-rs");
    if (imageRs) {
      type Transformer = { toBufferSync(format: string): { buffer: Buffer; width: number; height: number } };
      const T = imageRs.ImageTransformer as { fromEncodedImage(b: Uint8Array): Transformer };
      decoders.push([
        "image-rs (zune-jpeg)",
        (_f, buf) => {
          const r = T.fromEncodedImage(buf).toBufferSync("rgb");
          return fromInterleaved(r.buffer, r.width, r.height, 3, 3);
        },
      ]);
    }
    const photon = await optionalModule("@silvia-odwyer/photon-node");
    if (photon) {
      type Img = { get_raw_pixels(): Uint8Array; get_width(): number; get_height(): number; free(): void };
      const P = (photon.PhotonImage ?? (photon.default as Record<string, unknown>).PhotonImage) as {
        new_from_byteslice(b: Uint8Array): Img;
      };
      decoders.push([
        "photon (jpeg-decoder)",
        (_f, buf) => {
          const img = P.new_from_byteslice(new Uint8Array(buf));
          const r = fromInterleaved(img.get_raw_pixels(), img.get_width(), img.get_height(), 4, 3);
          img.free();
          return r;
        },
      ]);
    }
    const jpegJs = await optionalModule("jpeg-js");
    if (jpegJs) {
      type Decoded = { width: number; height: number; data: Uint8Array };
      const decode = (jpegJs.decode ?? (jpegJs.default as Record<string, unknown>).decode) as (b: Uint8Array, o: object) => Decoded;
      decoders.push([
        "jpeg-js",
        (_f, buf) => {
          const r = decode(buf, { useTArray: true, formatAsRGBA: false });
          return fromInterleaved(r.data, r.width, r.height, 3, 3);
        },
      ]);
    }
    const missing = [
      imageRs ? null : "@julusian/image-rs",
      photon ? null : "@silvia-odwyer/photon-node",
      jpegJs ? null : "jpeg-js",
    ].filter((m) => m !== null);
    if (missing.length > 0) {
      console.log(`not resolvable, columns left out: ${missing.join(", ")} (npm install --prefix DIR …; JPEG_PARITY_PREFIX=DIR)`);
    }

    // Encode.
    const specs = cases();
    const files: { spec: CaseSpec; file: string; buf: Buffer; label: string; encoder: string }[] = [];
    let skipped = 0;
    for (const [index, spec] of specs.entries()) {
      const encoded = await encode(spec, tools, index);
      if (encoded === null) {
        skipped++;
        continue;
      }
      const [buf, encoder] = encoded;
      const file = join(dir, `case-${index}.jpg`);
      writeFileSync(file, buf);
      const label = `${spec.content} ${spec.width}x${spec.height} ${describeJpeg(buf)} q${spec.quality}`;
      files.push({ spec, file, buf, label, encoder });
    }

    // Decode with Pillow in one go, the rest per file.
    const pillow = pillowAll(python, files.map((f) => f.file), dir);
    const columns = ["Pillow", ...decoders.map(([name]) => name)];
    const refPaths = imageRs !== null && tools.djpeg;
    const header = ["case", "enc", ...columns, ...(refPaths ? ["zune vs turbo"] : [])];
    const rows: string[][] = [];
    const perDecoder = new Map<string, Diff[]>(columns.map((c) => [c, []]));
    const refDiffs: Diff[] = [];
    for (const [n, f] of files.entries()) {
      const decoded = await decodeImage(f.buf, { maxImageWidth: null, maxImageHeight: null, maxAlloc: DEFAULT_MAX_ALLOC });
      const [height, width, channels] = decoded.tensorInfo.shape as [number, number, number];
      const mine: Raw = { width, height, channels, data: decoded.data };
      const shape = [height, width, channels];
      if (canonicalContentHash(shape, "UINT8", mine.data) !== decoded.contentHash) throw new Error("decodeImage hash mismatch");
      const outputs = new Map<string, Raw>();
      outputs.set("Pillow", pillow[n]!);
      for (const [name, dec] of decoders) {
        const raw = dec(f.file, f.buf);
        // Decoders that always give RGB: take one channel of a grey image.
        outputs.set(name, raw.channels === channels ? raw : fromInterleaved(raw.data, raw.width, raw.height, raw.channels, channels));
      }
      const row = [f.label, f.encoder];
      for (const c of columns) {
        const d = compare(mine, outputs.get(c)!);
        perDecoder.get(c)!.push(d);
        row.push(cell(d));
      }
      if (refPaths) {
        const d = compare(outputs.get("djpeg int")!, outputs.get("image-rs (zune-jpeg)")!);
        refDiffs.push(d);
        row.push(cell(d));
      }
      rows.push(row);
    }

    console.log(
      `\n${files.length} JPEGs${skipped > 0 ? ` (${skipped} skipped: no encoder)` : ""}; each cell against sharp (decodeImage): ` +
        "✓ = identical bytes and equal content hash; else <share of differing bytes>/<max abs difference>, ✗ = content hash differs\n",
    );
    const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
    const line = (r: string[]) => `| ${r.map((v, i) => v.padEnd(widths[i]!)).join(" | ")} |`;
    console.log(line(header));
    console.log(`|${widths.map((w) => "-".repeat(w + 2)).join("|")}|`);
    for (const r of rows) console.log(line(r));

    console.log("\nsummary against sharp: cases identical (hash equal), median and max share of differing bytes, max abs difference");
    const summarise = (name: string, diffs: Diff[]) => {
      const same = diffs.filter((d) => d.identical).length;
      const fr = diffs.map((d) => d.fraction).sort((a, b) => a - b);
      const med = fr[fr.length >> 1] ?? 0;
      const max = fr[fr.length - 1] ?? 0;
      const maxAbs = Math.max(0, ...diffs.map((d) => d.maxAbs));
      console.log(
        `  ${name.padEnd(24)} ${String(same).padStart(2)}/${diffs.length} identical, median ${(med * 100).toFixed(2)}%, ` +
          `max ${(max * 100).toFixed(1)}%, max |Δ| ${maxAbs}`,
      );
    };
    for (const c of columns) summarise(c, perDecoder.get(c)!);
    if (refPaths) summarise("zune vs turbo (ref)", refDiffs);
    console.log(`\n${((performance.now() - started) / 1000).toFixed(1)} s`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
