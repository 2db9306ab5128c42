import { Code } from "@connectrpc/connect";
import { Command, InvalidArgumentError } from "commander";
import { CliError, reportError, snakeCodeName, usageError, withExitCodes } from "../rpc/index.js";
import { parseU64 } from "../kv/index.js";
import { toJson, type JsonValue } from "@bufbuild/protobuf";
import { Cbi1FrameSchema, type Cbi1Frame as Cbi1FrameMessage } from "../../gen/mmgate/kvrelay/v1/cbi1_pb.js";
import { Cbi1Error, encodeDelta, encodeSnapshotChunks, FilterFormat, MAX_BUCKET_COUNT, peekFormat, type BucketImage } from "./cbi1/index.js";
import { frameToProto } from "./decoded/index.js";

/** Where the cbi1 commands read and write; the process's streams by default. */
export interface Cbi1CliIo {
  readonly out: { write(text: string): unknown };
  readonly err: { write(text: string): unknown };
  /** Where `decode -` (or `decode` without HEX) reads its hex; process.stdin by default. */
  readonly in?: AsyncIterable<string | Uint8Array> | Iterable<string | Uint8Array>;
}

function parseBuckets(text: string): number {
  if (!/^(0x[0-9a-fA-F]{1,8}|[0-9]{1,10})$/.test(text) || !FilterFormat.isValidBucketCount(Number(text))) {
    throw new InvalidArgumentError(`--buckets must be a power of two from 2 to ${MAX_BUCKET_COUNT}, not "${text}"`);
  }
  return Number(text);
}

const u64Option = (what: string) => (text: string) => parseU64(text, what);

function parseImage(text: string, previous: BucketImage[] | undefined): BucketImage[] {
  const match = /^([^:]*):(.*)$/.exec(text);
  if (match === null) throw new InvalidArgumentError(`image "${text}" is not BUCKET:VALUE`);
  const [, bucketText, valueText] = match as unknown as [string, string, string];
  if (!/^(0x[0-9a-fA-F]{1,8}|[0-9]{1,10})$/.test(bucketText) || Number(bucketText) > 0xffff_ffff) {
    throw new InvalidArgumentError(`image "${text}": bucket "${bucketText}" is not a u32 in decimal or 0x-hex`);
  }
  const value = parseU64(valueText, `image "${text}": the value`);
  // Appended in place, as kv's tokens are: a copy per image would be quadratic.
  const images = previous ?? [];
  images.push({ bucket: Number(bucketText), value });
  return images;
}

function parseWord(text: string, previous: bigint[] | undefined): bigint[] {
  const words = previous ?? [];
  words.push(parseU64(text, `word ${words.length}`));
  return words;
}

/** JSON with every bigint as a decimal string, so that no JSON reader rounds a u64. */
function json(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => (typeof v === "bigint" ? String(v) : v));
}

function toHex(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("hex");
}

/** Hex to bytes, whitespace ignored; throws an Error naming the problem. */
function parseHex(text: string): Uint8Array {
  const hex = text.replace(/\s+/g, "");
  if (hex.length === 0) throw new Error("no hex to decode");
  const bad = /[^0-9a-fA-F]/.exec(hex);
  if (bad !== null) throw new Error(`hex has a non-hex character ${JSON.stringify(bad[0])} at digit ${bad.index}`);
  if (hex.length % 2 !== 0) throw new Error(`hex has an odd number of digits (${hex.length}): a byte is two digits`);
  // A copy into an ArrayBuffer of its own (Buffer.from may hand out a slice of its pool).
  return new Uint8Array(Buffer.from(hex, "hex"));
}

async function readAll(input: AsyncIterable<string | Uint8Array> | Iterable<string | Uint8Array>): Promise<string> {
  let text = "";
  const decoder = new TextDecoder();
  for await (const chunk of input) text += typeof chunk === "string" ? chunk : decoder.decode(chunk, { stream: true });
  return text + decoder.decode();
}

/**
 * A frame as the protobuf JSON of mmgate.kvrelay.v1.Cbi1Frame (u64s as
 * decimal strings, every field written, zeros included): the same JSON
 * Cbi1Service.Decode answers through `buf curl` and `relay watch --decoded`
 * prints.
 */
export function cbi1FrameJson(frame: Cbi1FrameMessage): JsonValue {
  return toJson(Cbi1FrameSchema, frame, { alwaysEmitImplicit: true });
}

interface FormatOptions {
  seed: bigint;
  buckets: number;
  dc: bigint;
  epoch: bigint;
}

interface DecodeOptions {
  seed?: bigint;
  buckets?: number;
  sparse?: boolean;
}

/**
 * `mmgate cbi1`: the CBI1 relay frame codec by hand, offline. `encode-delta`
 * and `encode-snapshot` print frames as hex, one per line; `decode` prints a
 * frame's header and body as one JSON object (u64 values as decimal strings)
 * or, for a frame the codec refuses, the typed error as JSON on stdout and a
 * line on stderr. Integers are decimal or 0x-hex. Exit codes: 0 done, 1 a
 * frame or input the codec refuses, 2 a usage error (malformed or
 * inconsistent options and operands).
 */
export function cbi1Command(io: Cbi1CliIo = { out: process.stdout, err: process.stderr }): Command {
  const cbi1 = new Command("cbi1").description("the CBI1 relay frame codec by hand: encode deltas and snapshot chunks as hex, decode hex frames to JSON");

  const fail = (command: string, err: unknown) => {
    process.exitCode = reportError(io.err, `cbi1 ${command}`, err);
  };
  /** Input the codec refuses: invalid_argument, the codec's own code first in the message. */
  const refused = (err: Cbi1Error) =>
    new CliError(snakeCodeName(Code.InvalidArgument), `${err.code}${err.formatKind !== undefined ? ` (${err.formatKind})` : ""}: ${err.message}`, { cause: err });
  /** Runs an encoder; a Cbi1Error is input the codec refuses, anything else a bug. */
  const encoding = (command: string, fn: () => void) => {
    try {
      fn();
    } catch (err) {
      if (!(err instanceof Cbi1Error)) throw err;
      fail(command, refused(err));
    }
  };
  const formatOptions = (command: Command, base: boolean) => {
    command
      .requiredOption("--seed <u64>", "the filter's seed", u64Option("--seed"))
      .requiredOption("--buckets <n>", `the filter's bucket count (a power of two from 2 to ${MAX_BUCKET_COUNT})`, parseBuckets)
      .requiredOption("--dc <u64>", "the producer's datacenter id", u64Option("--dc"));
    if (base) command.requiredOption("--base <u64>", "the delta's base epoch (the sequence the consumer must hold)", u64Option("--base"));
    return command.requiredOption("--epoch <u64>", base ? "the delta's target epoch" : "the snapshot's epoch", u64Option("--epoch"));
  };

  formatOptions(cbi1.command("encode-delta").description("print a delta frame (absolute bucket images) as one line of hex"), true)
    .argument("[image...]", "bucket images as BUCKET:VALUE (bucket a u32, value a u64); none is an empty delta", parseImage)
    .action((images: BucketImage[] | undefined, o: FormatOptions & { base: bigint }) => {
      const list = images ?? [];
      const outside = list.find((image) => image.bucket >= o.buckets);
      if (outside !== undefined) {
        fail("encode-delta", usageError(`image "${outside.bucket}:${outside.value}": bucket ${outside.bucket} is outside 0..${o.buckets - 1} (--buckets ${o.buckets})`));
        return;
      }
      encoding("encode-delta", () => {
        io.out.write(`${toHex(encodeDelta(new FilterFormat(o.seed, o.buckets), o.dc, o.base, o.epoch, list))}\n`);
      });
    });

  formatOptions(cbi1.command("encode-snapshot").description("print a snapshot's chunk frames as hex, one line per chunk"), false)
    .argument("<word...>", "the bucket words (u64) of buckets 0..N-1 in order, exactly --buckets of them", parseWord)
    .action((words: bigint[], o: FormatOptions) => {
      if (words.length !== o.buckets) {
        fail("encode-snapshot", usageError(`--buckets ${o.buckets} needs exactly ${o.buckets} words (buckets 0..${o.buckets - 1} in order), got ${words.length}`));
        return;
      }
      encoding("encode-snapshot", () => {
        for (const chunk of encodeSnapshotChunks(new FilterFormat(o.seed, o.buckets), o.dc, o.epoch, BigUint64Array.from(words))) {
          io.out.write(`${toHex(chunk)}\n`);
        }
      });
    });

  cbi1
    .command("decode")
    .description(
      "decode one hex frame and print it as the protobuf JSON of mmgate.kvrelay.v1.Cbi1Frame; a refused frame prints its error (code, details) and exits 1",
    )
    .argument("[hex]", 'the frame as hex (whitespace ignored); "-" or none reads it from stdin')
    .option("--seed <u64>", "the expected filter seed (with --buckets; without both, the frame's own format is taken)", u64Option("--seed"))
    .option("--buckets <n>", "the expected bucket count (with --seed)", parseBuckets)
    .option("--sparse", "a snapshot chunk's non-zero words only (SnapshotChunk.nonzero)")
    .option("--json", "print the protobuf JSON of mmgate.kvrelay.v1.Cbi1Frame (the default, and the only form)")
    .action(async (hexArg: string | undefined, o: DecodeOptions) => {
      if ((o.seed === undefined) !== (o.buckets === undefined)) {
        fail("decode", usageError("--seed and --buckets go together: give both to check the frame's format, or neither to take it from the frame"));
        return;
      }
      let frame: Uint8Array;
      try {
        frame = parseHex(hexArg === undefined || hexArg === "-" ? await readAll(io.in ?? process.stdin) : hexArg);
      } catch (err) {
        // Text that is no hex frame, from the operand or stdin alike: input, not a usage error.
        fail("decode", new CliError(snakeCodeName(Code.InvalidArgument), err instanceof Error ? err.message : String(err)));
        return;
      }
      try {
        const format = o.seed !== undefined && o.buckets !== undefined ? new FilterFormat(o.seed, o.buckets) : peekFormat(frame);
        io.out.write(`${JSON.stringify(cbi1FrameJson(frameToProto(frame, { format, sparse: o.sparse === true })))}\n`);
      } catch (err) {
        if (!(err instanceof Cbi1Error)) throw err;
        const error = { code: err.code, ...(err.formatKind !== undefined ? { formatKind: err.formatKind } : {}), message: err.message, details: err.details };
        io.out.write(`${json({ error })}\n`);
        fail("decode", refused(err));
      }
    });
  for (const command of cbi1.commands) withExitCodes(command, { 1: "the codec refuses the frame or the input (decode prints the typed error as JSON too)" });
  return cbi1;
}
