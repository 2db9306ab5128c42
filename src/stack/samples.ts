/**
 * Sample inputs for the commands a stack suggests: a multimodal request in
 * the reference's JSON shape carrying a small generated PNG as a data URL
 * (`mmgate hop generate`), and router events as JSON lines (`mmgate kv
 * publish`).
 */
import { writeFileSync } from "node:fs";
import { deflateSync } from "node:zlib";

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

function crc32(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function chunk(type: string, data: Buffer): Buffer {
  const body = Buffer.concat([Buffer.from(type, "latin1"), data]);
  const length = Buffer.alloc(4);
  length.writeUInt32BE(data.length);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(body));
  return Buffer.concat([length, body, crc]);
}

/** A `width` x `height` 8-bit RGB PNG of a colour gradient. */
export function gradientPng(width: number, height: number): Buffer {
  const header = Buffer.alloc(13);
  header.writeUInt32BE(width, 0);
  header.writeUInt32BE(height, 4);
  header.set([8, 2, 0, 0, 0], 8); // 8 bits, RGB, deflate, no filter, no interlace
  const rows = Buffer.alloc(height * (1 + width * 3));
  for (let y = 0; y < height; y++) {
    const row = y * (1 + width * 3);
    rows[row] = 0; // filter: none
    for (let x = 0; x < width; x++) {
      const at = row + 1 + x * 3;
      rows[at] = Math.round((255 * x) / Math.max(1, width - 1));
      rows[at + 1] = Math.round((255 * y) / Math.max(1, height - 1));
      rows[at + 2] = 128;
    }
  }
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk("IHDR", header), chunk("IDAT", deflateSync(rows)), chunk("IEND", Buffer.alloc(0))]);
}

/** A multimodal PreprocessedRequest in the reference's JSON shape: three tokens and one image. */
export function sampleRequest(): Record<string, unknown> {
  return {
    model: "mmgate-demo",
    token_ids: [1, 2, 3],
    multi_modal_data: { image: [{ Url: `data:image/png;base64,${gradientPng(16, 16).toString("base64")}` }] },
    stop_conditions: { max_tokens: 4 },
  };
}

/** Router events as the reference's JSON lines: a worker storing a chain of three blocks, then removing the last. */
export const SAMPLE_EVENTS: readonly string[] = [
  '{"worker_id":1,"event":{"event_id":1,"dp_rank":0,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":900000,"tokens_hash":9143094415614847814}]}}}}',
  '{"worker_id":1,"event":{"event_id":2,"dp_rank":0,"data":{"stored":{"parent_hash":900000,"blocks":[{"block_hash":900001,"tokens_hash":1311768467463790320},{"block_hash":900002,"tokens_hash":"18446744073709551615"}]}}}}',
  '{"worker_id":1,"event":{"event_id":3,"dp_rank":0,"data":{"removed":{"block_hashes":[900002]}}}}',
];

export function writeSamples(requestFile: string, eventsFile: string): void {
  writeFileSync(requestFile, `${JSON.stringify(sampleRequest(), null, 2)}\n`);
  writeFileSync(eventsFile, `${SAMPLE_EVENTS.join("\n")}\n`);
}
